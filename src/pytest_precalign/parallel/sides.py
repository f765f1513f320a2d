"""Load a multi-rank side as one merged trace: our rank folders (``parallel`` manifests) or,
with a layout given, an msprobe dump; one step folder or a run root (all its steps)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TraceError
from ..trace.checksums import folder_identity, recheck
from ..trace.records import Trace
from ..trace.run_ids import RunIds
from ..trace.step_scalars import scalars_of
from .dp_scalars import join_scalars
from .joined_parts import RootSteps, joined_parts
from .layout import ParallelLayout, layout_from_manifest, parallel_rank_folders
from .merge import Chunk, RankTrace, merge_ranks, replica_leads
from .rules import MEGATRON_GPT_RULES, ShardRule
from .steps import combine_steps, split_incomplete

_SIZES = ("tp", "pp", "dp", "cp", "ep", "vpp", "order")


def load_parallel_side(
    path: str | Path,
    flag: ParallelLayout | None = None,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
    *,
    data_split: bool = False,
) -> Trace | None:
    """The merged trace of a multi-rank side, or None when ``path`` is not one (and no layout
    was given for it). ``data_split``: its DP replicas ran different micro-batches."""
    root = Path(path)
    found = parallel_rank_folders(root)
    if found is not None:
        # A run resumed into a new root is joined with its first part (``joined_parts``).
        parts = joined_parts(root, found, lambda r, f: _read_root(r, f, flag, rules, data_split))
        steps = [step for part in parts for step in part.steps]
        sources = {step: where for part in parts for step, where in part.sources.items()}
        incomplete = [told for part in parts for told in part.incomplete]
        merged = combine_steps(steps, root, sources)
        if incomplete:  # a run interrupted mid-step: every verdict says so (run/outcome.py)
            merged = merged.with_notes(incomplete_steps=tuple(incomplete))
        return merged
    if flag is None:
        return None
    from ..msprobe import is_msprobe_dump

    if is_msprobe_dump(root):
        from .msprobe_ranks import load_msprobe_parallel

        return load_msprobe_parallel(root, flag)
    if flag.world_size == 1:
        return None
    raise ConfigError(
        f"--parallel ({flag.describe()}): {root} is neither an msprobe dump nor a folder of "
        "rank<R>/ trace folders with 'parallel' manifests"
    )


def _read_root(
    root: Path,
    found: Mapping[int, Mapping[int, Path]],
    flag: ParallelLayout | None,
    rules: Sequence[ShardRule],
    data_split: bool,
) -> RootSteps:
    """The steps of one run root, each merged across its ranks."""
    complete, incomplete = split_incomplete(root, found)
    # Which write of each rank folder is there before any is read, re-checked once all are
    # read: a rerun re-publishing the root meanwhile is refused, never read half old, half new;
    # and the steps read all come from one run (their run ids, ``trace.run_ids``).
    identities = {folder: folder_identity(folder) for ranks in complete.values() for folder in ranks.values()}
    ids = RunIds(root)
    steps = [
        (step, _merge_step(root, step, ranks, flag, rules, data_split, ids))
        for step, ranks in complete.items()
    ]
    sources = {step: str(manifest_file(ranks[min(ranks)])) for step, ranks in complete.items() if ranks}
    recheck(root, identities)
    ids.check()
    return RootSteps(root, steps, sources, ids, incomplete, tuple(sorted(found)))


def _merge_step(
    root: Path,
    step: int,
    ranks: Mapping[int, Path],
    flag: ParallelLayout | None,
    rules: Sequence[ShardRule],
    data_split: bool = False,
    ids: RunIds | None = None,
) -> Trace:
    folder = root / f"step{step}" if (root / f"step{step}").is_dir() else root
    if not ranks:
        raise TraceError(f"{folder}: no rank<R>/ folders in this step folder")
    traces = {r: read_rank_folder(p) for r, p in ranks.items()}
    for r, trace in traces.items():
        if ids is not None:
            ids.add(step, r, trace.manifest, str(manifest_file(ranks[r])))
    if not any(t.records for t in traces.values()):  # a step recorded as scalars only
        return _scalars_only(traces, ranks, flag, data_split, root)
    layouts = {r: _layout(traces[r], p) for r, p in ranks.items()}
    first = min(layouts)
    layout = layouts[first]
    for r, other in layouts.items():
        if [getattr(other, k) for k in _SIZES] != [getattr(layout, k) for k in _SIZES]:
            raise TraceError(
                f"{folder}: rank manifests disagree on the layout: rank{first} says {layout.describe()}; "
                f"rank{r} says {other.describe()}"
            )
    if flag is not None:
        _check_flag(flag, layout, folder)
    # Checked against the folders that exist, never by enumerating the world a file claims
    # (a 2 KB manifest saying world_size 10**9 once took 23 GB): work bounded by len(ranks).
    extra = sorted(r for r in ranks if not 0 <= r < layout.world_size)
    missing = next((r for r in range(len(ranks) + 1) if r not in ranks), None)
    if extra or missing is not None and missing < layout.world_size:
        what = f"rank{extra[0]}/ is beyond the world" if extra else f"rank{missing}/ is missing"
        raise TraceError(
            f"{folder}: {what}: the manifests say world_size {layout.world_size} "
            f"(rank0/ .. rank{layout.world_size - 1}/ expected, {layout.describe()})"
        )
    _check_steps(folder, traces)
    rank_traces = [_rank_trace(r, ranks[r], traces[r], layout) for r in sorted(ranks)]
    mode = flag.replicas if flag is not None else "auto"
    merged = merge_ranks(
        rank_traces,
        layout,
        where=str(folder),
        rules=rules,
        key_prefix=f"s{step}.",
        data_split=data_split,
        replica_mode=mode,
    )
    if data_split or layout.dp // layout.ep < 2:
        return merged
    joined = any(block.joined for block in merged.notes.dp_join.values())
    return _with_dp_scalars(merged, [(r, ranks[r], traces[r]) for r in replica_leads(layout)], joined)


def _with_dp_scalars(trace: Trace, leads: Sequence[tuple[int, Path, Trace]], joined: bool) -> Trace:
    """``trace`` with its DP replicas' scalars joined (``dp_scalars``); the replicas that
    disagree on what they must share are findings (``replica_mismatches``)."""
    scalars, findings = join_scalars([(str(folder), t.run.scalars) for _, folder, t in leads], joined=joined)
    if scalars is None and not findings:
        return trace
    joined_trace = trace if scalars is None else trace.with_run(replace(trace.run, scalars=scalars))
    if findings:
        mismatches = (*findings, *trace.notes.replica_mismatches)
        joined_trace = joined_trace.with_notes(replica_mismatches=mismatches)
    return joined_trace


def _scalars_only(
    traces: Mapping[int, Trace],
    ranks: Mapping[int, Path],
    flag: ParallelLayout | None,
    data_split: bool,
    root: Path,
) -> Trace:
    """A step every rank recorded as scalars only: rank 0's manifest, with the DP replicas'
    scalars joined when the ranks are data-parallel replicas (their batch hashes say whether
    they saw different rows). A step ``steps=`` did not select has no ``parallel`` block: the
    run's is read from another step of the same rank (``_sibling_layout``)."""
    first = traces[min(traces)]
    block = first.manifest.get("parallel")
    if data_split or len(traces) < 2:
        return first
    where = str(manifest_file(ranks[min(ranks)]))
    if not isinstance(block, Mapping):
        block, where = _sibling_layout(root, min(ranks))
    if not isinstance(block, Mapping):
        return first
    layout = layout_from_manifest(block, where)
    if layout.dp // layout.ep < 2 or any(r not in traces for r in replica_leads(layout)):
        return first
    leads = [(r, ranks[r], traces[r]) for r in replica_leads(layout)]
    held = [scalars_of(t.manifest, str(folder)) for _, folder, t in leads]
    hashes = [s.batch_hash for h in held for s in h.values()]
    joined = (flag is not None and flag.replicas == "joined") or len(set(hashes)) > 1
    if joined and flag is not None and flag.replicas == "same":
        raise TraceError(
            f"{ranks[leads[1][0]]}: the DP replicas saw different data (their batch hashes differ), "
            "and replicas=same refuses to join them"
        )
    return _with_dp_scalars(first, leads, joined)


def _sibling_layout(root: Path, rank: int) -> tuple[Mapping[str, Any] | None, str]:
    """The run's ``parallel`` block as another step's folder of ``rank`` holds it (the first
    step that recorded layers), and where it was read; None when no step has one (a run
    recorded as scalars only)."""
    for folder in sorted(root.glob(f"step*/rank{rank}")):
        if not folder.is_dir():
            continue
        block = read_rank_folder(folder).manifest.get("parallel")
        if isinstance(block, Mapping):
            return block, str(manifest_file(folder))
    return None, ""


def read_rank_folder(folder: Path) -> Trace:
    """One rank folder of a run: our trace, or an msprobe dump our ``Recorder`` wrote (its
    manifest kept beside dump.json). A ``manifest.json`` that is there but not a regular file
    (a link, a FIFO) is refused by the trace reader, naming it."""
    if os.path.lexists(folder / "manifest.json"):
        from ..trace.native_io import read_trace

        return read_trace(folder)
    from ..msprobe import read_msprobe_dump

    return read_msprobe_dump(folder)


def manifest_file(folder: Path) -> Path:
    """Where a rank folder's manifest is: ``manifest.json``, or the one our ``Recorder`` kept
    beside an msprobe dump.json."""
    from ..msprobe.layout import DUMP_FILE, MANIFEST_SIDECAR

    return folder / MANIFEST_SIDECAR if (folder / DUMP_FILE).is_file() else folder / "manifest.json"


def _layout(trace: Trace, folder: Path) -> ParallelLayout:
    block = trace.manifest.get("parallel")
    where = str(manifest_file(folder))
    if block is None:
        what = "no 'parallel' block" if os.path.lexists(where) else "missing"
        raise TraceError(f"{where}: {what} (its sibling rank folders have one)")
    return layout_from_manifest(block, where)


def _check_flag(flag: ParallelLayout, layout: ParallelLayout, folder: Path) -> None:
    for key in ("tp", "pp", "dp", "vpp", "order"):
        given, found = getattr(flag, key), getattr(layout, key)
        if key == "dp" and flag.dp == 1:
            continue  # not given: dp follows from the world size
        if given != found and not (key == "vpp" and (given or 1) == (found or 1)):
            raise ConfigError(
                f"--parallel says {key}={given}, but the rank manifests in {folder} say {key}={found} "
                f"({layout.describe()}); drop the option or fix it"
            )


def _check_steps(folder: Path, traces: Mapping[int, Trace]) -> None:
    held = {r: (sorted({rec.step for rec in t.records}), t.manifest.get("step")) for r, t in traces.items()}
    first = min(held)
    for r, value in held.items():
        if value != held[first]:
            raise TraceError(
                f"{folder}: ranks from different steps: rank{first}/ holds step(s) {held[first][0]} "
                f"(manifest step {held[first][1]!r}), rank{r}/ holds {value[0]} (manifest step {value[1]!r})"
            )


def _rank_trace(rank: int, folder: Path, trace: Trace, layout: ParallelLayout) -> RankTrace:
    block = trace.manifest["parallel"]
    where = str(manifest_file(folder))
    if block.get("rank", rank) != rank:
        raise TraceError(f"{where}: 'parallel.rank' is {block.get('rank')!r}, but the folder is rank{rank}/")
    for dim, value in layout.coords(rank).items():
        given = block.get(f"{dim}_rank", value)
        if given != value:
            raise TraceError(
                f"{where}: {dim}_rank {given!r}, but rank {rank} of {layout.describe()} is {dim}_rank {value}"
            )
    return RankTrace(rank, str(folder), trace, _chunks(block.get("chunks"), where))


def _chunks(value: Any, where: str) -> tuple[Chunk, ...]:
    if value is None:
        return (Chunk(),)
    bad = TraceError(
        f"{where}: 'parallel.chunks' must be a list of {{index, prefix, layer_offsets: {{path: int}}}}"
    )
    if not isinstance(value, list) or not value:
        raise bad
    out = []
    for item in value:
        offsets = item.get("layer_offsets", {}) if isinstance(item, dict) else None
        if not (
            isinstance(item, dict)
            and isinstance(item.get("index", 0), int)
            and isinstance(item.get("prefix", ""), str)
            and isinstance(offsets, dict)
            and all(isinstance(k, str) and isinstance(v, int) for k, v in offsets.items())
        ):
            raise bad
        out.append(Chunk(int(item.get("index", 0)), str(item.get("prefix", "")), dict(offsets)))
    return tuple(out)
