"""Statistics merged from parts (``trace/merged_stats``) are the statistics of the parts'
concatenation, computed by the recorder on that concatenated tensor: max, min, mean and norm
equal within float rounding, NaN/Inf counted."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_precalign.recording.tensor_summary import tensor_stats
from pytest_precalign.trace.merged_stats import merge_stats, merged_name, merged_record, with_merged
from pytest_precalign.trace.records import Record, Trace, record_from_dict


def _merged(parts: list[torch.Tensor]):
    return merge_stats([(tensor_stats(p), p.numel()) for p in parts])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_merged_statistics_are_those_of_the_concatenated_tensor(dtype):
    gen = torch.Generator().manual_seed(0)
    # Unequal sizes and offsets: an unweighted mean of the means would be wrong.
    parts = [
        (torch.randn(2, 3, 16, generator=gen) * 3 + 1).to(dtype),
        torch.randn(2, 3, 8, generator=gen).to(dtype) - 2,
        torch.rand(5, generator=gen).to(dtype) * 10,
    ]
    whole = tensor_stats(torch.cat([p.reshape(-1) for p in parts]))
    merged = _merged(parts)
    for key in ("max", "min", "mean", "norm"):
        assert getattr(merged, key) == pytest.approx(getattr(whole, key), rel=1e-6, abs=1e-7), key
    # Not the unweighted mean: the parts' sizes matter.
    plain = sum(tensor_stats(p).mean for p in parts) / len(parts)
    assert abs(plain - whole.mean) > 0.1


def test_nonfinite_parts_merge_like_the_whole_and_empty_parts_add_nothing():
    finite = torch.tensor([1.0, -2.0, 3.0])
    with_inf = torch.tensor([float("inf"), 0.5])
    with_nan = torch.tensor([float("nan"), 4.0, float("inf")])
    merged = _merged([finite, with_inf, torch.empty(0)])
    whole = tensor_stats(torch.cat([finite, with_inf]))
    assert (merged.max, merged.min, merged.norm, merged.inf, merged.nan) == (
        whole.max,
        whole.min,
        whole.norm,
        1,
        0,
    )
    merged = _merged([finite, with_nan])
    assert math.isnan(merged.max) and math.isnan(merged.min) and math.isnan(merged.mean)
    assert (merged.nan, merged.inf) == (1, 1)
    assert _merged([torch.empty(0)]).norm == 0.0


@pytest.mark.parametrize(
    ("names", "merged"),
    [
        (
            ["a.self_attn.q_proj", "a.self_attn.k_proj", "a.self_attn.v_proj"],
            "a.self_attn.{q_proj,k_proj,v_proj}",
        ),
        (["a.mlp.gate_proj.weight", "a.mlp.up_proj.weight"], "a.mlp.{gate_proj,up_proj}.weight"),
        (["x.w", "y.z.w"], "{x,y.z}.w"),
        (["only.one"], "only.one"),
    ],
)
def test_merged_names_brace_the_parts_that_differ(names, merged):
    assert merged_name(names) == merged


def _rec(seq: int, name: str, kind: str = "activation", deps: tuple[str, ...] = ()) -> Record:
    t = torch.full((2, seq + 1), float(seq))
    return Record(
        seq,
        name,
        "Linear",
        "forward",
        0,
        0,
        kind,
        "out",
        "float32",
        tuple(t.shape),
        tensor_stats(t),
        deps=deps,
    )


def test_a_merged_record_takes_the_place_of_its_last_part_and_their_deps():
    inp = _rec(0, "attn.q", "input")
    q, k, v = (_rec(n, f"attn.{p}", deps=(inp.id,)) for n, p in ((1, "q"), (2, "k"), (3, "v")))
    user = _rec(4, "attn.rope", deps=(q.id, k.id))
    whole = merged_record([q, k, v])
    assert (whole.name, whole.seq, whole.shape, whole.merged) == (
        "attn.{q,k,v}",
        3,
        (18,),
        ("attn.q", "attn.k", "attn.v"),
    )
    assert whole.deps == (inp.id,)
    trace = with_merged(Trace({"record_mode": "stats"}, (inp, q, k, v, user)), [whole])
    assert [r.name for r in trace.records] == ["attn.q", "attn.{q,k,v}", "attn.rope"]
    assert trace.records[2].deps == (whole.id,)
    assert record_from_dict(whole.as_dict()) == whole  # a saved mapped trace keeps its parts
