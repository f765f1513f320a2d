"""Expert parallelism in the one merge of rank folders (``parallel/merge.py``): each EP rank's
local experts become global experts, everything else is EP rank 0's copy."""

from __future__ import annotations

import pytest

from pytest_precalign.errors import TraceError
from pytest_precalign.parallel.layout import ParallelLayout
from pytest_precalign.parallel.merge import RankTrace, globalize_expert, merge_ranks
from pytest_precalign.trace.records import Record, Stats, Trace

EXPERTS = "decoder.layers.0.mlp.experts.local_experts"


def _rank(rank: int) -> RankTrace:
    names = ["decoder.layers.0.mlp.router", f"{EXPERTS}.0", f"{EXPERTS}.1", "decoder.layers.0.mlp"]
    records = tuple(
        Record(
            i,
            name,
            "M",
            "forward",
            0,
            0,
            "activation",
            "out",
            "float32",
            (2,),
            stats=Stats(max=float(10 * rank + i), min=0.0, mean=1.0, norm=1.0),
        )  # fmt: skip
        for i, name in enumerate(names)
    )
    return RankTrace(rank, f"rank{rank}", Trace({"record_mode": "stats"}, records, {}))


def test_expert_ranks_hold_global_experts_and_rank0_keeps_the_rest() -> None:
    assert globalize_expert(f"{EXPERTS}.1.linear_fc2.weight", 1, 2) == f"{EXPERTS}.3.linear_fc2.weight"
    merged = merge_ranks([_rank(0), _rank(1)], ParallelLayout(dp=2, ep=2), where="x")
    got = [(r.name, r.stats.max if r.stats else None) for r in merged.records]
    assert got == [
        ("decoder.layers.0.mlp.router", 0.0),
        (f"{EXPERTS}.0", 1.0),
        (f"{EXPERTS}.2", 11.0),  # EP rank 1's local expert 0
        (f"{EXPERTS}.1", 2.0),
        (f"{EXPERTS}.3", 12.0),
        ("decoder.layers.0.mlp", 3.0),  # EP rank 0's copy
    ]


def test_expert_ranks_over_pipeline_stages_are_refused() -> None:
    with pytest.raises(TraceError, match="expert-parallel ranks over pipeline stages, is not supported"):
        merge_ranks([_rank(r) for r in range(4)], ParallelLayout(pp=2, dp=2, ep=2), where="x")
