"""Statistics mode across fused tensors (issue #25, item 11): HF's q/k/v (gate/up) outputs,
grads and weights cannot be split out of Megatron's fused ``linear_qkv`` (``linear_fc1``)
statistics, so they are merged and compared against the fused record, as ``merged_stats``
evidence. Built from real tensors, fused by the built-in Qwen2.5 preset's own transform."""

from __future__ import annotations

import torch

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable
from pytest_precalign.mapping.apply import map_trace
from pytest_precalign.mapping.spec import read_mapping_file, reverse
from pytest_precalign.mapping.transforms import apply_forward
from pytest_precalign.recording.tensor_summary import tensor_stats
from pytest_precalign.reports.coverage_text import coverage_text
from pytest_precalign.trace.merged_stats import with_merged
from pytest_precalign.trace.records import Record, Trace
from pytest_precalign.verdict.coverage import measure_coverage
from tests.helpers.paths import REPO

PRESET = REPO / "src" / "pytest_precalign" / "presets" / "megatron-qwen2.5.yaml"
HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}
QKV = "model.layers.0.self_attn.{q_proj,k_proj,v_proj}"


def _record(seq: int, name: str, slot: str, t: torch.Tensor, kind: str = "activation") -> Record:
    phase = "backward" if kind == "param_grad" else "forward"
    return Record(seq, name, "Linear", phase, 0, 0, kind, slot, "float32", tuple(t.shape), tensor_stats(t))


def _traces(k_scale: float = 1.0) -> tuple[Trace, Trace]:
    """HF's q, k, v outputs [b, s, x] (baseline) and Megatron's fused linear_qkv output [s, b, x]
    (candidate), the fused one made by the preset's qkv_fuse + transpose, k scaled by
    ``k_scale`` inside it."""
    mapping = read_mapping_file(PRESET, "qwen2.5", HEADS)
    rule = next(
        r for r in mapping.tensors if r.candidate == ("decoder.layers.{i}.self_attention.linear_qkv",)
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, generator=gen) for n in (16, 8, 8))
    (fused,) = apply_forward(rule.ops, [q, k * k_scale, v])
    names = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    base = tuple(_record(n, name, "out", t) for n, (name, t) in enumerate(zip(names, (q, k, v), strict=True)))
    cand = (_record(0, "decoder.layers.0.self_attention.linear_qkv", "out.0", fused),)
    return Trace({"record_mode": "stats"}, base), Trace({"record_mode": "stats"}, cand)


def _compare(base: Trace, cand: Trace, reversed_: bool = False):
    mapping = read_mapping_file(PRESET, "qwen2.5", HEADS)
    if reversed_:
        base, cand, mapping = cand, base, reverse(mapping)
    mapped = map_trace(cand, base, mapping)
    table = ToleranceTable("t", (ToleranceRule(atol=1e-6, rtol=0.0, why="fp32, same arithmetic"),))
    return compare_traces(with_merged(base, mapped.baseline_merged), mapped.trace, table, mapped.reasons)


def test_q_k_v_statistics_merged_meet_the_fused_qkv_record_and_count_as_three_outputs():
    comparison = _compare(*_traces())
    (pair,) = comparison.pairs
    assert (pair.record.name, pair.status, pair.evidence) == (QKV, "ok", "merged_stats")
    assert pair.record.merged == tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    assert "merged statistics of " + QKV + " (baseline) against one fused tensor (candidate)" in pair.note
    assert "statistical evidence" in pair.note and "not element-wise" in pair.note
    coverage = measure_coverage(comparison.pairs, "forward", 0.5)
    assert (coverage.outputs, coverage.paired, coverage.merged) == (3, 3, 3)
    assert coverage_text(coverage).endswith("; 3 by merged statistics")


def test_a_fault_in_k_alone_fails_the_merged_group_naming_k_proj():
    (pair,) = _compare(*_traces(k_scale=1.01)).pairs
    assert pair.status == "fail" and pair.evidence == "merged_stats"
    assert "k_proj" in pair.record.name and pair.failing is not None
    assert pair.failing.metric.startswith("stats.")


def test_the_reversed_mapping_merges_the_candidates_parts_under_the_fused_name():
    base, cand = _traces()
    (pair,) = _compare(base, cand, reversed_=True).pairs
    assert pair.record.name == "decoder.layers.0.self_attention.linear_qkv" and pair.status == "ok"
    assert pair.evidence == "merged_stats" and pair.candidate is not None
    assert pair.candidate.shape == pair.record.shape == (3, 2, 32)  # the fused shape, checked
    base, cand = _traces(k_scale=1.01)
    (pair,) = _compare(base, cand, reversed_=True).pairs
    assert pair.status == "fail"


def test_param_grads_of_q_k_v_merge_against_the_fused_weights_grad():
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(n, 16, generator=gen) for n in (16, 8, 8)]
    mapping = read_mapping_file(PRESET, "qwen2.5", HEADS)
    rule = next(
        r for r in mapping.tensors if r.candidate == ("decoder.layers.{i}.self_attention.linear_qkv.weight",)
    )
    (fused,) = apply_forward(rule.ops, grads)
    names = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    base = Trace(
        {"record_mode": "stats"},
        tuple(
            _record(n, name, "", g, "param_grad")
            for n, (name, g) in enumerate(zip(names, grads, strict=True))
        ),
    )
    cand = Trace(
        {"record_mode": "stats"},
        (_record(0, "decoder.layers.0.self_attention.linear_qkv.weight", "", fused, "param_grad"),),
    )
    (pair,) = _compare(base, cand).pairs
    assert (pair.record.name, pair.status, pair.evidence) == (QKV + ".weight", "ok", "merged_stats")
