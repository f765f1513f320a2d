"""msprobe multi-rank dumps (``step<N>/rank<R>/dump.json``), whose rank folders carry no
layout, merged with a layout given by the user (``--parallel`` or compare.json's
``parallel_merge``), as msprobe's own graph merge does.

Ranks are placed by the sizes and Megatron's order; pipeline stages are renumbered by the
count of layers each (virtual) stage holds: a stage's ``<path>.layers.<i>`` gets the number
of layers of the stages before it added. With a virtual pipeline, a record of model chunk
``k`` is expected to start with ``<k>.`` (msprobe's name for item ``k`` of a list of chunks).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import TraceError
from ..trace.records import Trace
from .layout import ParallelLayout
from .merge import Chunk, RankTrace, merge_ranks
from .steps import combine_steps

_LAYERS = re.compile(r"^(.*?\blayers)\.(\d+)(?=\.|$)")


def load_msprobe_parallel(root: Path, layout: ParallelLayout) -> Trace:
    from ..msprobe import read_msprobe_set

    found = read_msprobe_set(root)
    by_step: dict[int, dict[int, Trace]] = {}
    for (step, rank), trace in found.items():
        by_step.setdefault(step, {})[rank] = trace
    merged = []
    for step, ranks in sorted(by_step.items()):
        expected = set(range(layout.world_size))
        missing, extra = sorted(expected - set(ranks)), sorted(set(ranks) - expected)
        folder = Path(next(iter(ranks.values())).manifest["path"]).parent
        if missing or extra:
            what = f"rank{missing[0]}/ is missing" if missing else f"rank{extra[0]}/ is beyond the world"
            raise TraceError(
                f"{folder}: {what}: --parallel says {layout.describe()}, world size {layout.world_size} "
                f"(rank0/ .. rank{layout.world_size - 1}/ expected; {len(ranks)} rank folders found: "
                "give dp= when the dump holds DP replicas)"
            )
        chunks = _chunks(ranks, layout)
        rank_traces = [
            RankTrace(r, str(ranks[r].manifest["path"]), ranks[r], chunks[r]) for r in sorted(ranks)
        ]
        merged.append((step, merge_ranks(rank_traces, layout, where=str(folder), key_prefix=f"s{step}.")))
    return combine_steps(merged, root)


def _chunk_of(name: str, vpp: int) -> tuple[int, str]:
    head, dot, _ = name.partition(".")
    if vpp > 1 and dot and head.isdigit() and int(head) < vpp:
        return int(head), f"{head}."
    return 0, ""


def _chunks(ranks: Mapping[int, Trace], layout: ParallelLayout) -> dict[int, tuple[Chunk, ...]]:
    """Each rank's chunks with layer offsets from the layer counts of the stages before it."""
    vpp = layout.vpp or 1
    counts: dict[int, dict[str, int]] = {}  # virtual stage -> ModuleList path -> layers
    for rank, trace in ranks.items():
        c = layout.coords(rank)
        if c["tp"] or c["dp"]:
            continue  # every TP rank and DP replica of a stage holds the same layers
        for rec in trace.records:
            k, prefix = _chunk_of(rec.name, vpp)
            m = _LAYERS.match(rec.name[len(prefix) :])
            if m:
                stage = counts.setdefault(k * layout.pp + c["pp"], {})
                stage[m.group(1)] = max(stage.get(m.group(1), 0), int(m.group(2)) + 1)
    out: dict[int, tuple[Chunk, ...]] = {}
    for rank in ranks:
        pp = layout.coords(rank)["pp"]
        chunks = []
        for k in range(vpp):
            v = k * layout.pp + pp
            offsets: dict[str, int] = {}
            for u in range(v):
                for path, n in counts.get(u, {}).items():
                    offsets[path] = offsets.get(path, 0) + n
            for path in counts.get(v, {}):
                offsets.setdefault(path, 0)
            chunks.append(Chunk(k, f"{k}." if vpp > 1 else "", offsets))
        out[rank] = tuple(chunks)
    return out
