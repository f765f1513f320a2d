"""Tensor parallelism (TP > 1) for the Megatron source: one process per rank, one trace back.

A megatron-core ``GPTModel`` with ``tensor_model_parallel_size = tp`` is run in ``tp``
spawned processes (gloo on CPU). Each rank records its own trace, in which sharded tensors
are that rank's slice; ``gather_traces`` puts them back together in the TP=1 layout, so the
gathered trace compares with a TP=1 Megatron run (same names) or, through the usual
mapping, with Hugging Face. How each tensor is sharded is data (``MEGATRON_GPT_RULES``),
so a wrong rule (``WRONG_FC1_RULES``) is a gather bug the comparison must catch.

Sharding of the local-spec GPTModel (Megatron's ColumnParallelLinear shards the output
features, RowParallelLinear the input features and all-reduces its output):

* ``linear_qkv``: weight/bias rows and the output's last dim are plain chunks. The fused
  layout is grouped per KV group ``[q_g, k_g, v_g]`` and each rank holds whole groups, so
  concatenating the ranks in order gives the TP=1 layout.
* ``linear_fc1`` (SwiGLU): each rank holds ``[gate_r; up_r]``; TP=1 is ``[gate; up]``, so
  gathering takes every rank's gate half, then every rank's up half ("gated").
* ``linear_proj``/``linear_fc2``: weight on dim 1, their inputs on the last dim.
* Word embeddings and the output layer: weight rows (vocabulary) on dim 0.
* Attention internals (q/k layernorm, core attention, softmax, dropout): the head dim.
* Everything else is replicated: norms, the all-reduced RowParallel outputs, the embedding
  output (all-reduced), the logits (``parallel_output=False`` gathers them).

Grads (``grad_output``, ``grad_input``, ``param_grad``) and parameters after optimizer steps
shard like the tensors they belong to.
"""

from __future__ import annotations

import fnmatch
import json
import tempfile
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import CaseError
from ..trace.records import Record, Trace

if TYPE_CHECKING:
    import torch

    from ..config.specs import CaseSpec, ModelSpec
    from ..sources.inputs import CaseInputs

Layout = Literal["replicated", "chunk", "gated"]
Role = Literal["param", "out", "in"]
# Which record kinds a rule's role covers: a tensor and the grads that belong to it.
ROLE_KINDS: Mapping[str, tuple[str, ...]] = {
    "param": ("param", "param_grad"),
    "out": ("activation", "grad_output"),
    "in": ("input", "grad_input"),
}
DEFAULT_TIMEOUT = 600.0  # seconds for all ranks together; a stuck collective must not hang pytest


@dataclass(frozen=True)
class ShardRule:
    """How records named ``name`` (a glob) with a slot matching ``slot`` are split over
    TP ranks. ``role``: ``param`` (weights, their grads, their values after steps), ``out``
    (module outputs and their grads) or ``in`` (module inputs and their grads)."""

    name: str
    role: Role
    layout: Layout
    dim: int = 0
    slot: str = "*"
    why: str = ""

    def matches(self, record: Record) -> bool:
        return (
            record.kind in ROLE_KINDS[self.role]
            and fnmatch.fnmatchcase(record.name, self.name)
            and fnmatch.fnmatchcase(record.slot, self.slot)
        )


_ATTN = "*.self_attention"
# First matching rule wins; a record no rule matches is replicated.
MEGATRON_GPT_RULES: tuple[ShardRule, ...] = (
    # Weights.
    ShardRule("*.linear_qkv.*", "param", "chunk", 0, why="column parallel; whole KV groups per rank"),
    ShardRule("*.linear_fc1.weight", "param", "gated", 0, why="column parallel; [gate_r; up_r] per rank"),
    ShardRule("*.linear_fc1.bias", "param", "gated", 0, why="column parallel; [gate_r; up_r] per rank"),
    ShardRule("*.linear_proj.weight", "param", "chunk", 1, why="row parallel: input features"),
    ShardRule("*.linear_fc2.weight", "param", "chunk", 1, why="row parallel: input features"),
    ShardRule("embedding.word_embeddings.weight", "param", "chunk", 0, why="vocab parallel"),
    ShardRule("output_layer.weight", "param", "chunk", 0, why="column parallel over the vocabulary"),
    # Column-parallel outputs (not gathered: gather_output=False inside the layers).
    ShardRule("*.linear_qkv", "out", "chunk", -1, slot="out.0", why="whole KV groups per rank"),
    ShardRule("*.linear_fc1", "out", "gated", -1, slot="out.0", why="[gate_r; up_r] per rank"),
    # Row-parallel inputs; their outputs are all-reduced (replicated).
    ShardRule("*.linear_proj", "in", "chunk", -1, slot="in.0", why="this rank's heads' context"),
    ShardRule("*.linear_fc2", "in", "chunk", -1, slot="in.0", why="this rank's ffn features"),
    # Attention internals: this rank's heads. q/k/v are [s, b, heads, d]; scores [b, heads, s, s].
    ShardRule(f"{_ATTN}.q_layernorm", "in", "chunk", 2, slot="in.0", why="heads"),
    ShardRule(f"{_ATTN}.q_layernorm", "out", "chunk", 2, why="heads"),
    ShardRule(f"{_ATTN}.k_layernorm", "in", "chunk", 2, slot="in.0", why="KV groups"),
    ShardRule(f"{_ATTN}.k_layernorm", "out", "chunk", 2, why="KV groups"),
    ShardRule(f"{_ATTN}.core_attention", "in", "chunk", 2, slot="in.[012]", why="q, k, v heads"),
    ShardRule(f"{_ATTN}.core_attention", "out", "chunk", -1, why="context [s, b, heads * d]"),
    ShardRule(f"{_ATTN}.core_attention.*", "in", "chunk", 1, slot="in.0", why="scores [b, heads, s, s]"),
    ShardRule(f"{_ATTN}.core_attention.*", "out", "chunk", 1, why="probabilities [b, heads, s, s]"),
)


def _plain_fc1(rules: Iterable[ShardRule]) -> tuple[ShardRule, ...]:
    return tuple(
        replace(r, layout="chunk", why="WRONG on purpose: fc1 concatenated as if [gate; up] were chunked")
        if r.layout == "gated"
        else r
        for r in rules
    )


# The classic TP layout bug, for tests: fc1 gathered by plain concatenation, which yields
# [gate_0; up_0; gate_1; up_1] instead of [gate; up].
WRONG_FC1_RULES: tuple[ShardRule, ...] = _plain_fc1(MEGATRON_GPT_RULES)


def rule_for(record: Record, rules: Sequence[ShardRule] = MEGATRON_GPT_RULES) -> ShardRule | None:
    return next((r for r in rules if r.matches(record)), None)


def _param_record(name: str, shape: tuple[int, ...]) -> Record:
    return Record(0, name, "", "step", 0, 0, "param", "", "", shape)


# -- the layout operations -------------------------------------------------------------------
def shard_tensor(full: torch.Tensor, layout: Layout, dim: int, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s slice of a TP=1 tensor."""
    if layout == "replicated":
        return full
    if full.shape[dim] % (tp * (2 if layout == "gated" else 1)):
        raise CaseError(f"cannot shard a tensor of shape {list(full.shape)} on dim {dim} over {tp} ranks")
    if layout == "chunk":
        return full.chunk(tp, dim)[rank]
    gate, up = full.chunk(2, dim)
    return _cat([gate.chunk(tp, dim)[rank], up.chunk(tp, dim)[rank]], dim)


def gather_tensor(shards: Sequence[torch.Tensor], layout: Layout, dim: int) -> torch.Tensor:
    """The TP=1 tensor from every rank's slice, in rank order."""
    if layout == "replicated":
        return shards[0]
    if layout == "chunk":
        return _cat(list(shards), dim)
    halves = [s.chunk(2, dim) for s in shards]
    return _cat([h[0] for h in halves] + [h[1] for h in halves], dim)


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    import torch

    return torch.cat(parts, dim).contiguous()


def shard_state(
    full: Mapping[str, torch.Tensor],
    tp: int,
    rank: int,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
) -> dict[str, torch.Tensor]:
    """A TP=1 Megatron state (``named_parameters`` names) -> rank ``rank``'s shard of it."""
    if not 0 <= rank < tp:
        raise CaseError(f"rank {rank} is not in 0..{tp - 1}")
    out = {}
    for name, tensor in full.items():
        rule = rule_for(_param_record(name, tuple(tensor.shape)), rules)
        if rule is None:
            out[name] = tensor.detach().clone()
        else:
            out[name] = shard_tensor(tensor.detach(), rule.layout, rule.dim, tp, rank).clone()
    return out


# -- gathering traces --------------------------------------------------------------------------
def gather_traces(
    traces: Sequence[Trace],
    *,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
    strict: bool = False,
) -> Trace:
    """Per-rank traces of one run (tensor mode) -> one trace in the TP=1 layout.

    Records follow rank 0's execution order; replicated tensors are rank 0's. What cannot be
    gathered (a record missing on some rank, shapes that disagree, a tensor no rule shards
    whose shape differs across ranks) keeps rank 0's record and gets a note in
    ``manifest["tensor_parallel"]["notes"]`` (record id -> text). Replicas that are not
    bitwise equal across ranks are noted too, and raise ``CaseError`` with ``strict``.
    """

    from ..recording.tensor_summary import tensor_stats

    if not traces:
        raise CaseError("gather_traces: no rank traces given")
    for rank, trace in enumerate(traces):
        if trace.mode != "tensor":
            raise CaseError(
                f"tensor parallel: rank {rank}'s trace was recorded in {trace.mode!r} mode; "
                "gathering shards needs record: {mode: tensor}"
            )
    tp = len(traces)
    by_id = [t.by_id() for t in traces]
    notes: dict[str, str] = {}
    tensors: dict[str, Any] = {}
    gathered: dict[tuple[tuple[str | None, ...], Layout, int], tuple[str, Any]] = {}
    records: list[Record] = []
    replicas_checked = 0

    def keep(rec: Record, note: str | None = None) -> Record:
        if note:
            notes[rec.id] = note
        if rec.tensor_key is not None:
            tensors[rec.tensor_key] = traces[0].tensors[rec.tensor_key]
        return rec

    for rec in traces[0].records:
        others = [ids.get(rec.id) for ids in by_id]
        missing = [r for r, other in enumerate(others) if other is None]
        if missing:
            records.append(keep(rec, f"only rank 0's slice: missing on rank(s) {missing}"))
            continue
        peers: list[Record] = [o for o in others if o is not None]
        if rec.tensor_key is None or any(p.tensor_key is None for p in peers):
            records.append(keep(rec))
            continue
        shards: list[torch.Tensor] = [
            t.tensors[p.tensor_key] for t, p in zip(traces, peers, strict=True) if p.tensor_key
        ]
        rule = rule_for(rec, rules)
        layout: Layout = rule.layout if rule is not None else "replicated"
        dim = rule.dim if rule is not None else 0
        shapes = [tuple(s.shape) for s in shards]
        if layout == "replicated":
            if any(s != shapes[0] for s in shapes):
                why = "no sharding rule" if rule is None else f"rule {rule.name!r} says replicated"
                records.append(
                    keep(rec, f"{why}, but the shape differs across ranks {shapes}: rank 0's slice")
                )
                continue
            replicas_checked += 1
            diffs = [_max_diff(shards[0], s) for s in shards[1:]]
            if any(d != 0.0 for d in diffs):
                text = (
                    f"replicated, but ranks differ (max |rank0 - rank r| = {max(diffs):.3e}): rank 0's kept"
                )
                if strict:
                    raise CaseError(f"tensor parallel: {rec.id}: {text}")
                notes[rec.id] = text
            records.append(keep(rec))
            continue
        if any(s != shapes[0] for s in shapes) or not shards[0].dim():
            records.append(
                keep(
                    rec,
                    f"rule {rule.name if rule else '?'!r}: rank shapes {shapes} cannot be gathered: rank 0's slice",
                )
            )
            continue
        cache_key = (tuple(p.tensor_key for p in peers), layout, dim)
        hit = gathered.get(cache_key)
        if hit is None:  # one tensor recorded under several names is gathered once
            full = gather_tensor(shards, layout, dim)
            hit = (f"g{len(gathered):07d}", full)
            gathered[cache_key] = hit
            tensors[hit[0]] = full
        key, full = hit
        records.append(replace(rec, shape=tuple(full.shape), stats=tensor_stats(full), tensor_key=key))

    rank0_ids = {r.id for r in traces[0].records}
    for rank, trace in enumerate(traces[1:], 1):
        for rec in trace.records:
            if rec.id not in rank0_ids and rec.id not in notes:
                notes[rec.id] = f"recorded on rank {rank} but not on rank 0: dropped"
    manifest = dict(traces[0].manifest)
    manifest.pop("tp_rank", None)
    manifest["tensor_parallel"] = {
        "size": tp,
        "rules": [
            f"{r.name} [{r.role} {r.slot}] {r.layout} dim {r.dim}" for r in rules if r.layout != "replicated"
        ],
        "replicas_checked": replicas_checked,
        "notes": notes,
    }
    return Trace(manifest=manifest, records=tuple(records), tensors=tensors)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    import torch

    if torch.equal(a, b):
        return 0.0
    if not (a.is_floating_point() or a.is_complex()):
        return float((a.double() - b.double()).abs().max())
    diff = (a.double() - b.double()).abs()
    return float(torch.nan_to_num(diff, nan=float("inf")).max())


# -- running the ranks ---------------------------------------------------------------------------
def run_megatron_tensor_parallel(
    spec: ModelSpec,
    base_dir: Path,
    case: CaseSpec,
    inputs: CaseInputs,
    full_weights: Mapping[str, torch.Tensor] | None,
    manifest: Mapping[str, Any],
    seed: int,
    *,
    gather_rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
    timeout: float = DEFAULT_TIMEOUT,
) -> Trace:
    """Run ``spec`` (a megatron model with ``tensor_parallel: tp``) in ``tp`` spawned ranks
    through ``runner.run_side`` and return their traces gathered to the TP=1 layout.

    ``full_weights``: a TP=1 state (``named_parameters``) each rank loads its shard of; None
    keeps Megatron's own initialisation. The parent's torch.distributed is not touched.
    """
    # The weights are always sharded by the true layout: ``gather_rules`` only changes how
    # the records are put back together (a wrong rule there is a gather bug to be caught).
    ranks = run_tensor_parallel_ranks(
        spec, base_dir, case, inputs, full_weights, manifest, seed, timeout=timeout
    )
    return gather_traces(ranks, rules=gather_rules)


def run_tensor_parallel_ranks(
    spec: ModelSpec,
    base_dir: Path,
    case: CaseSpec,
    inputs: CaseInputs,
    full_weights: Mapping[str, torch.Tensor] | None,
    manifest: Mapping[str, Any],
    seed: int,
    *,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Trace]:
    """The ranks' own traces (in memory), before gathering; ``rules`` shard ``full_weights``."""
    import torch
    from safetensors.torch import save_file
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException, start_processes

    from ..sources.megatron import tensor_parallel
    from ..trace.native_io import read_trace

    tp = tensor_parallel(spec)
    what = f"{spec.where}: models.{spec.name} (tensor_parallel: {tp})"
    if case.record.mode != "tensor":
        raise CaseError(
            f"{what}: case {case.name!r} records in {case.record.mode!r} mode; gathering the "
            "ranks' shards needs record: {mode: tensor}"
        )
    if spec.device != "cpu":
        raise CaseError(
            f"{what}: spawned tensor-parallel ranks run on the CPU (gloo) only, not {spec.device!r}"
        )
    with tempfile.TemporaryDirectory(prefix="precalign-tp-") as tmp:
        work = Path(tmp)
        torch.save({"model_inputs": dict(inputs.model_inputs), "labels": inputs.labels}, work / "inputs.pt")
        if full_weights is not None:
            for rank in range(tp):
                save_file(
                    shard_state(full_weights, tp, rank, rules),
                    str(work / f"weights{rank}.safetensors"),
                )
        settings = {
            # The parent runs inside runner.deterministic(); the ranks repeat what it set
            # (the environment variables it set are inherited by the spawned processes).
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "timeout": timeout,
        }
        child_case = replace(case, mapping=None)  # the ranks never map; keeps the pickle small
        ctx = start_processes(
            _rank_main,
            args=(tp, str(work), spec, base_dir, child_case, dict(manifest), seed, settings),
            nprocs=tp,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise CaseError(f"{what}: the ranks did not finish within {timeout:.0f} s")
        except ProcessRaisedException as exc:
            raise CaseError(
                f"{what}: rank {exc.error_index} failed: {_child_error(work, exc.error_index, exc)}"
            ) from None
        except ProcessExitedException as exc:
            raise CaseError(
                f"{what}: rank {exc.error_index} died (exit code {exc.exit_code}"
                + (f", signal {exc.signal_name}" if exc.signal_name else "")
                + f"){_child_error_suffix(work, exc.error_index)}"
            ) from None
        finally:
            for process in ctx.processes:  # only our own ranks, on timeout or failure
                if process.is_alive():
                    process.terminate()
                    process.join(5)
        traces = []
        for rank in range(tp):
            trace = read_trace(work / f"rank{rank}")
            # Read every tensor now: the directory is removed on return.
            traces.append(replace(trace, tensors={k: trace.tensors[k].clone() for k in trace.tensors}))
    return traces


def _child_error(work: Path, rank: int, exc: BaseException) -> str:
    file = work / f"error{rank}.json"
    if file.exists():
        data = json.loads(file.read_text(encoding="utf-8"))
        return f"{data['type']}: {data['message']}"
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _child_error_suffix(work: Path, rank: int) -> str:
    file = work / f"error{rank}.json"
    if not file.exists():
        return ""
    data = json.loads(file.read_text(encoding="utf-8"))
    return f": {data['type']}: {data['message']}"


def _rank_main(
    rank: int,
    tp: int,
    work_dir: str,
    spec: ModelSpec,
    base_dir: Path,
    case: CaseSpec,
    manifest: dict[str, Any],
    seed: int,
    settings: dict[str, Any],
) -> None:
    """One rank (in a spawned process): build, load the shard, record, write the trace."""
    import torch

    # The ranks share the parent's cores: one thread each, so 2 ranks on 2 cores do not
    # oversubscribe (the results do not depend on it on CPU).
    torch.set_num_threads(1)
    work = Path(work_dir)
    try:
        _rank_run(rank, tp, work, spec, base_dir, case, manifest, seed, settings)
    except BaseException as exc:
        from ..sources import one_line

        message = {"type": type(exc).__name__, "message": one_line(exc), "traceback": traceback.format_exc()}
        (work / f"error{rank}.json").write_text(json.dumps(message), encoding="utf-8")
        raise


def _rank_run(
    rank: int,
    tp: int,
    work: Path,
    spec: ModelSpec,
    base_dir: Path,
    case: CaseSpec,
    manifest: dict[str, Any],
    seed: int,
    settings: dict[str, Any],
) -> None:
    import torch
    import torch.distributed as dist

    from ..recording.determinism import deterministic
    from ..sources import build_model, runtime
    from ..sources.inputs import CaseInputs
    from ..trace.native_io import write_trace
    from .side import run_side

    dist.init_process_group(
        "gloo",
        init_method=f"file://{work / 'rendezvous'}",
        rank=rank,
        world_size=tp,
        timeout=timedelta(seconds=float(settings["timeout"])),
    )
    try:
        # sources.runtime sees the group and creates only Megatron's model-parallel state
        # (tensor_model_parallel_size = tp) and the CPU RNG tracker, then tears them down.
        with deterministic(bool(settings["deterministic"])), runtime(spec):
            model = build_model(spec, base_dir)
            weights = work / f"weights{rank}.safetensors"
            if weights.exists():
                _load_shard(model.module, weights, rank)
            blob = torch.load(work / "inputs.pt", weights_only=False)
            inputs = CaseInputs(blob["model_inputs"], blob["labels"])
            rank_info = {"tp_rank": rank, "torch_threads": torch.get_num_threads()}
            trace = run_side(model, inputs, case, {**manifest, **rank_info}, seed)
        write_trace(trace, work / f"rank{rank}")
    finally:
        dist.destroy_process_group()


def _load_shard(module: torch.nn.Module, file: Path, rank: int) -> None:
    import torch
    from safetensors.torch import load_file

    shard = load_file(str(file))
    params = dict(module.named_parameters())
    missing = sorted(set(params) - set(shard))
    unknown = sorted(set(shard) - set(params))
    if missing or unknown:
        raise CaseError(
            f"rank {rank}: the TP=1 weights do not fit the TP model: "
            + (f"no weight for {missing[:3]} " if missing else "")
            + (f"no parameter for {unknown[:3]}" if unknown else "")
        )
    with torch.no_grad():
        for name, param in params.items():
            if tuple(param.shape) != tuple(shard[name].shape):
                raise CaseError(
                    f"rank {rank}: shard of {name} has shape {list(shard[name].shape)}, "
                    f"the rank's parameter {list(param.shape)}"
                )
            param.copy_(shard[name])
