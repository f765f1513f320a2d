"""The rank folders of a launched run (``ROOT/step<N>/rank<R>``, written by the public
``Recorder``) -> one trace in the canonical unsharded TP=1 layout.

Per step: each rank's record names are renumbered to the global layer indices (the manifest's
``parallel.chunks[0].layer_offsets``: a stage's ``decoder.layers.0`` is global layer
``offset``) and, on expert-parallel rank r holding n experts, ``local_experts.i`` to global
expert ``r * n + i`` (the first EP rank's copy of everything else is kept); the tensor-parallel ranks of each pipeline stage are gathered by the shard rules
(``tensor_parallel.gather_traces``); the stages are put in execution order (forward: first
stage to last, backward: last to first, parameters after the step: first to last). The steps
follow each other; ``seq`` is renumbered and tensor keys made unique.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import CaseError
from ..parallel.rules import MEGATRON_GPT_RULES, ShardRule
from ..trace.records import Record, Trace
from .tensor_parallel import gather_traces

_PHASE_ORDER = {"forward": 0, "backward": 1, "step": 2}


def globalize(name: str, offsets: Mapping[str, int]) -> str:
    """``decoder.layers.0.mlp`` on a stage whose layers start at 2 -> ``decoder.layers.2.mlp``."""
    for path, offset in offsets.items():
        if not offset:
            continue
        match = (
            re.match(rf"^{re.escape(path)}\.(\d+)(?=\.|$)", name)
            if path
            else re.match(r"^(\d+)(?=\.|$)", name)
        )
        if match:
            head = f"{path}." if path else ""
            return f"{head}{int(match.group(1)) + offset}{name[match.end() :]}"
    return name


_EXPERT = re.compile(r"(\.local_experts\.)(\d+)(?=\.|$)")


def globalize_expert(name: str, ep_rank: int, local: int) -> str:
    """``...experts.local_experts.1`` on expert-parallel rank 1 holding ``local`` = 2 experts ->
    ``...experts.local_experts.3``: rank r's expert i is global expert ``r * local + i``."""
    if not ep_rank:
        return name
    return _EXPERT.sub(lambda m: f"{m.group(1)}{ep_rank * local + int(m.group(2))}", name, count=1)


def _experts_globalized(trace: Trace, ep_rank: int) -> Trace:
    """An expert-parallel rank's trace with its local experts renamed to their global index."""
    if not ep_rank:
        return trace
    local = 1 + max((int(m.group(2)) for r in trace.records if (m := _EXPERT.search(r.name))), default=-1)

    def name(n: str) -> str:
        return globalize_expert(n, ep_rank, local)

    def rid(i: str) -> str:
        head, sep, rest = i.partition("|")
        return name(head) + sep + rest

    records = tuple(r.renamed(name(r.name), tuple(rid(d) for d in r.deps)) for r in trace.records)
    return replace(trace, records=records)


def _globalize_id(rid: str, offsets: Mapping[str, int]) -> str:
    name, sep, rest = rid.partition("|")
    return globalize(name, offsets) + sep + rest


def globalized(trace: Trace) -> Trace:
    """A rank's trace with its layers renumbered to their global indices."""
    chunks = (trace.manifest.get("parallel") or {}).get("chunks") or [{}]
    if len(chunks) != 1:
        raise CaseError("launched ranks: virtual pipeline chunks are not supported")
    offsets: Mapping[str, int] = chunks[0].get("layer_offsets") or {}
    records = tuple(
        r.renamed(globalize(r.name, offsets), tuple(_globalize_id(d, offsets) for d in r.deps))
        for r in trace.records
    )
    return replace(trace, records=records)


def read_step(folder: Path, nproc: int) -> list[Trace]:
    """The ``rank<R>`` traces of one step folder, all ``nproc`` of them."""
    from ..trace.native_io import read_trace

    missing = [r for r in range(nproc) if not (folder / f"rank{r}").is_dir()]
    if missing:
        raise CaseError(f"launched ranks: {folder} has no folder for rank(s) {missing}")
    return [read_trace(folder / f"rank{r}") for r in range(nproc)]


def merge_step(traces: Sequence[Trace], rules: Sequence[ShardRule] = MEGATRON_GPT_RULES) -> Trace:
    """One step's rank traces -> one TP=1 trace (records in execution order)."""
    by_stage: dict[tuple[int, int], list[tuple[int, Trace]]] = {}
    for rank, trace in enumerate(traces):
        layout = trace.manifest.get("parallel") or {}
        ep, ep_rank = int(layout.get("ep", 1)), int(layout.get("ep_rank", 0))
        if int(layout.get("dp", 1)) != ep or int(layout.get("cp", 1)) != 1:
            raise CaseError(f"launched ranks: rank {rank} has data or context parallelism, not supported")
        where = (int(layout.get("pp_rank", 0)), ep_rank)
        by_stage.setdefault(where, []).append(
            (int(layout.get("tp_rank", 0)), _experts_globalized(trace, ep_rank))
        )
    keyed: list[tuple[tuple[int, int, int], Record]] = []
    tensors: dict[str, Any] = {}
    manifest: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for stage, ep_rank in sorted(by_stage):
        ranks = [globalized(t) for _, t in sorted(by_stage[stage, ep_rank], key=lambda item: item[0])]
        gathered = gather_traces(ranks, rules=rules)
        manifest = manifest or dict(gathered.manifest)
        notes.update(gathered.manifest["tensor_parallel"]["notes"])
        for pos, rec in enumerate(gathered.records):
            phase = _PHASE_ORDER.get(rec.phase, 3)
            key = None if rec.tensor_key is None else f"p{stage}e{ep_rank}{rec.tensor_key}"
            if key is not None:
                tensors[key] = gathered.tensors[rec.tensor_key]  # type: ignore[index]
            keyed.append(((phase, -stage if phase == 1 else stage, pos), replace(rec, tensor_key=key)))
    manifest["tensor_parallel"] = {**manifest["tensor_parallel"], "notes": notes}
    records = tuple(rec for _, rec in sorted(_one_per_id(keyed), key=lambda item: item[0]))
    return Trace(
        manifest=manifest,
        records=records,
        tensors={r.tensor_key: tensors[r.tensor_key] for r in records if r.tensor_key},
    )


def _one_per_id(
    keyed: list[tuple[tuple[int, int, int], Record]],
) -> list[tuple[tuple[int, int, int], Record]]:
    """A module that runs on several stages (the decoder block, the rotary embedding) is
    recorded once per stage under one name: its inputs (and the grads w.r.t. them) are the
    first stage's, its outputs (and their grads) the last stage's."""
    kept: dict[str, tuple[tuple[int, int, int], Record, int]] = {}
    for key, rec in keyed:
        stage = abs(key[1])
        earlier = kept.get(rec.id)
        first_wins = rec.kind in ("input", "grad_input")
        if earlier is None or (stage < earlier[2] if first_wins else stage > earlier[2]):
            kept[rec.id] = (key, rec, stage)
    return [(key, rec) for key, rec, _ in kept.values()]


def merge_launched(
    root: Path,
    nproc: int,
    manifest: Mapping[str, Any],
    *,
    params: bool = True,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
) -> Trace:
    """Every ``step<N>`` under ``root`` merged, the steps in order; ``params=False`` drops the
    parameter records (the in-process path records them only after an optimizer step)."""
    steps = sorted((int(p.name[4:]), p) for p in root.glob("step*") if p.is_dir() and p.name[4:].isdigit())
    if not steps:
        raise CaseError(f"launched ranks: nothing was recorded under {root}")
    records: list[Record] = []
    tensors: dict[str, Any] = {}
    parallel: dict[str, Any] = {}
    for step, folder in steps:
        merged = merge_step(read_step(folder, nproc), rules)
        parallel = {**(merged.manifest.get("parallel") or {}), "merged": merged.manifest["tensor_parallel"]}
        for rec in merged.records:
            if rec.kind == "param" and not params:
                continue
            key = None if rec.tensor_key is None else f"s{step}{rec.tensor_key}"
            if key is not None:
                # Read now: the rank folders are removed once merged.
                tensors[key] = merged.tensors[rec.tensor_key].clone()  # type: ignore[index]
            records.append(replace(rec, seq=len(records), tensor_key=key))
    for key in ("rank", "tp_rank", "pp_rank", "dp_rank", "cp_rank", "ep_rank", "chunks", "sharding"):
        parallel.pop(key, None)
    first = read_step(steps[0][1], 1)[0].manifest
    out = {**dict(manifest), "record_mode": first.get("record_mode", "stats"), "parallel": parallel}
    if "record_level" in first:
        out["record_level"] = first["record_level"]
    return Trace(manifest=out, records=tuple(records), tensors=tensors)


__all__ = ["globalize", "globalized", "merge_launched", "merge_step", "read_step"]
