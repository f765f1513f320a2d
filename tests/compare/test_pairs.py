from __future__ import annotations

import math

import pytest
import torch

from pytest_precalign.compare import metrics
from pytest_precalign.compare.pairs import compare_traces, same_elements
from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable
from pytest_precalign.recording.tensor_summary import tensor_crc32, tensor_stats
from pytest_precalign.trace.records import Record, Trace
from pytest_precalign.verdict.phase import phase_verdict


def test_metrics_match_their_definitions():
    a = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    b = torch.tensor([1.0, 2.004, 3.0], dtype=torch.float64)
    assert metrics.max_abs(a, b) == pytest.approx(1.0)
    assert metrics.mean_abs(a, b) == pytest.approx((0 + 0.004 + 1.0) / 3)
    assert metrics.max_rel(a, b) == pytest.approx(0.25)
    assert metrics.euclidean(a, b) == pytest.approx(math.sqrt(0.004**2 + 1.0))
    assert metrics.cosine(a, b) == pytest.approx(float(a @ b / (a.norm() * b.norm())))
    assert metrics.one_thousandth(a, b) == pytest.approx(1 / 3)  # only the exact element
    assert metrics.five_thousandth(a, b) == pytest.approx(2 / 3)  # 0.002 rel err is within 5/1000
    zeros = torch.zeros(3, dtype=torch.float64)
    assert metrics.cosine(zeros, zeros) == 1.0
    assert metrics.cosine(zeros, a) == 0.0


def test_closeness_follows_torch_testing():
    a = torch.tensor([[1.0, 100.0], [0.0, -5.0]], dtype=torch.float64)
    b = a.clone()
    b[0, 1] += 0.05  # within rtol 1e-3 * 100 = 0.1
    b[1, 0] += 0.02  # not within atol 1e-2
    c = metrics.closeness(a, b, atol=1e-2, rtol=1e-3)
    assert c.mismatched == 1
    assert c.worst_index == (1, 0)
    assert c.worst_abs == pytest.approx(0.02)
    assert c.worst_allowed == pytest.approx(1e-2)
    assert c.greatest_abs == pytest.approx(0.05)
    assert c.greatest_abs_index == (0, 1)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(b, a, atol=1e-2, rtol=1e-3)


def test_nonfinite_values_match_only_when_equal():
    a = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float64)
    same = metrics.closeness(a, a.clone(), 0.0, 0.0)
    assert (same.mismatched, same.nonfinite_mismatch) == (0, 0)
    b = torch.tensor([1.0, 2.0, float("-inf")], dtype=torch.float64)
    diff = metrics.closeness(a, b, 1.0, 1.0)
    assert diff.nonfinite_mismatch == 2


def _rec(seq, name, kind="activation", shape=(4,), deps=(), step=0, slot="out"):
    phase = {
        "activation": "forward",
        "input": "forward",
        "logits": "forward",
        "loss": "forward",
        "grad_output": "backward",
        "grad_input": "backward",
        "param_grad": "backward",
        "param": "step",
    }[kind]
    return Record(
        seq=seq,
        name=name,
        module_class="M",
        phase=phase,
        step=step,
        call=0,
        kind=kind,
        slot=slot,
        dtype="float32",
        shape=shape,
        tensor_key=f"t{seq}",
        deps=deps,
    )


def _trace(records, tensors):
    recs = tuple(records)
    return Trace({"record_mode": "tensor"}, recs, {r.tensor_key: tensors[r.name, r.kind] for r in recs})


TABLE = ToleranceTable("t", (ToleranceRule(atol=1e-6, rtol=0.0, why="tight"),))


def _chain(bug_in: str | None, bug_in_input_of: str | None = None):
    """x -> a.lin -> a -> b.lin -> b; the bug perturbs a module's output or input."""
    x = torch.arange(4.0)
    vals = {}
    vals["a.lin", "input"] = x
    vals["a.lin", "activation"] = x * 2 + (1 if bug_in == "a.lin" else 0)
    vals["a", "input"] = x
    vals["a", "activation"] = vals["a.lin", "activation"] + (1 if bug_in == "a" else 0)
    vals["b.lin", "input"] = vals["a", "activation"] + (1 if bug_in_input_of == "b.lin" else 0)
    vals["b.lin", "activation"] = vals["b.lin", "input"] * 3
    vals["b", "input"] = vals["a", "activation"]
    vals["b", "activation"] = vals["b.lin", "activation"]
    recs = [
        _rec(0, "a", "input"),
        _rec(1, "a.lin", "input"),
        _rec(2, "a.lin", deps=("a.lin|input|out|0|0",)),
        _rec(3, "a", deps=("a|input|out|0|0",)),
        _rec(4, "b", "input"),
        _rec(5, "b.lin", "input"),
        _rec(6, "b.lin", deps=("b.lin|input|out|0|0",)),
        _rec(7, "b", deps=("b|input|out|0|0",)),
    ]
    return _trace(recs, vals)


def test_first_divergence_is_the_origin_when_inputs_matched():
    verdict = phase_verdict(compare_traces(_chain(None), _chain("a"), TABLE), "forward", None, False)
    assert not verdict.aligned and not verdict.passed
    assert verdict.first is not None
    assert (verdict.first.name, verdict.first.origin, verdict.first.metric) == ("a", True, "allclose")
    assert verdict.first.value == pytest.approx(1.0)
    assert {p.record.name for p in verdict.failures} == {"a", "b.lin", "b"}


def test_first_divergence_in_execution_order_finds_the_innermost():
    verdict = phase_verdict(compare_traces(_chain(None), _chain("a.lin"), TABLE), "forward", None, False)
    assert verdict.first is not None and (verdict.first.name, verdict.first.origin) == ("a.lin", True)


def test_divergence_entering_between_modules_is_propagated_and_names_the_parent():
    verdict = phase_verdict(
        compare_traces(_chain(None), _chain(None, "b.lin"), TABLE), "forward", None, False
    )
    first = verdict.first
    assert first is not None
    assert (first.name, first.origin, first.origin_module) == ("b.lin", False, "b")


def test_aligned_traces_pass_and_unmatched_records_are_listed():
    base = _chain(None)
    cand = Trace(base.manifest, base.records[:-1], base.tensors)
    verdict = phase_verdict(compare_traces(base, cand, TABLE), "forward", None, False)
    assert verdict.aligned and verdict.passed and verdict.first is None
    assert [r.name for r in verdict.only_baseline] == ["b"]


def test_shape_mismatch_is_a_finding_not_a_crash():
    base = _trace([_rec(0, "a", shape=(4,))], {("a", "activation"): torch.zeros(4)})
    cand = _trace([_rec(0, "a", shape=(2, 2))], {("a", "activation"): torch.zeros(2, 2)})
    verdict = phase_verdict(compare_traces(base, cand, TABLE), "forward", None, False)
    assert verdict.first is not None and verdict.first.metric == "shape"
    assert "shape [2, 2] (candidate) != [4] (baseline)" in verdict.failures[0].note


def test_metric_bounds_and_first_matching_rule():
    table = ToleranceTable(
        "t",
        (
            ToleranceRule(match="loose*", bounds=(("cosine", 0.99),), why="loose"),
            ToleranceRule(atol=0.0, rtol=0.0, why="exact"),
        ),
    )
    x = torch.tensor([1.0, 2.0, 3.0])
    y = x * 1.001
    base = _trace(
        [_rec(0, "loose"), _rec(1, "strict")], {("loose", "activation"): x, ("strict", "activation"): x}
    )
    cand = _trace(
        [_rec(0, "loose"), _rec(1, "strict")], {("loose", "activation"): y, ("strict", "activation"): y}
    )
    comparison = compare_traces(base, cand, table)
    by_name = {p.record.name: p for p in comparison.pairs}
    assert by_name["loose"].passed and by_name["loose"].checks[0].metric == "cosine"
    assert not by_name["strict"].passed and by_name["strict"].tolerance.why == "exact"


def test_stats_and_hash_evidence():
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[3] += 0.5

    def stats_trace(t):
        r = Record(0, "a", "M", "forward", 0, 0, "activation", "out", "float32", (64,), stats=tensor_stats(t))
        return Trace({}, (r,))

    def hash_trace(t):
        r = Record(0, "a", "M", "forward", 0, 0, "activation", "out", "float32", (64,), crc32=tensor_crc32(t))
        return Trace({}, (r,))

    stats_cmp = compare_traces(stats_trace(x), stats_trace(y), TABLE).pairs[0]
    assert stats_cmp.evidence == "stats" and not stats_cmp.passed
    assert compare_traces(stats_trace(x), stats_trace(x.clone()), TABLE).pairs[0].passed
    hash_cmp = compare_traces(hash_trace(x), hash_trace(y), TABLE).pairs[0]
    assert hash_cmp.evidence == "hash" and not hash_cmp.passed and hash_cmp.failing.metric == "crc32"
    assert compare_traces(hash_trace(x), hash_trace(x.clone()), TABLE).pairs[0].passed


def test_dtype_defaults_like_torch_testing():
    table = ToleranceTable("empty")
    tol = table.lookup("x", "activation", "forward", "bfloat16", 0)
    assert (tol.rtol, tol.atol) == (1.6e-2, 1e-5)
    assert "torch.testing default" in tol.why
    assert table.lookup("x", "activation", "forward", "int64", 0).atol == 0.0


def test_first_nan_is_reported_per_side():
    x = torch.ones(4)
    y = torch.ones(4)
    y[2] = float("nan")

    def trace(vals):
        recs = [
            Record(i, name, "M", "forward", 0, 0, "activation", "out", "float32", (4,), stats=tensor_stats(v))
            for i, (name, v) in enumerate(vals)
        ]
        return Trace({}, tuple(recs))

    base = trace([("a", x), ("b", x), ("c", x)])
    cand = trace([("a", x), ("b", y), ("c", y)])
    verdict = phase_verdict(compare_traces(base, cand, TABLE), "forward", None, False)
    assert [(nf.side, nf.record.name, nf.record.stats.nan) for nf in verdict.nonfinite] == [
        ("candidate", "b", 1)
    ]
    assert verdict.first is not None and (verdict.first.name, verdict.first.metric) == ("b", "nonfinite")


def test_report_json_is_strict_json(tmp_path):
    import json

    from pytest_precalign.reports.document import report_document

    # What write_reports writes to report.json: the document, dumped with allow_nan=False.
    document = report_document([{"value": float("inf"), "nested": [float("nan"), -float("inf"), 1.5]}], {})
    text = json.dumps(document, indent=1, allow_nan=False)
    assert "Infinity" not in text and "NaN" not in text
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    assert data["cases"][0] == {"value": "inf", "nested": ["nan", "-inf", 1.5]}


def test_overflow_levels_of_the_candidate():
    from pytest_precalign.verdict.overflow import overflow_levels

    def rec(seq, name, kind, values, deps=()):
        t = torch.tensor(values)
        return Record(
            seq,
            name,
            "M",
            "forward",
            0,
            0,
            kind,
            "out" if kind == "activation" else "in.0",
            "float32",
            tuple(t.shape),
            stats=tensor_stats(t),
            deps=deps,
        )

    records = [
        rec(0, "a", "input", [1.0, 2.0]),
        rec(1, "a", "activation", [float("inf"), 1.0], ("a|input|in.0|0|0",)),
        rec(2, "b", "input", [float("inf"), 1.0]),
        rec(3, "b", "activation", [float("nan"), 1.0], ("b|input|in.0|0|0",)),
        rec(4, "c", "input", [float("nan"), 1.0]),
        rec(5, "c", "activation", [0.0, 1.0], ("c|input|in.0|0|0",)),
        rec(6, "d", "input", [1e-3, 1e-3]),
        rec(7, "d", "activation", [1e5, 1e5], ("d|input|in.0|0|0",)),
        rec(8, "e", "input", [1.0, 1.0]),
        rec(9, "e", "activation", [2.0, 2.0], ("e|input|in.0|0|0",)),
        rec(10, "f", "input", [1e-6, 1e-6]),  # rsqrt of a small variance: large ratio, modest values
        rec(11, "f", "activation", [1e3, 1e3], ("f|input|in.0|0|0",)),
    ]
    levels = {o.record.name: o.level for o in overflow_levels(records, {r.id: r for r in records})}
    assert levels == {"a": "critical", "b": "high", "c": "medium", "d": "high"}


def test_shapes_that_differ_only_in_dimensions_of_size_1_are_compared_element_wise():
    # transformers 4.41 returns rotary cos/sin as [4, 8], 4.42 as [1, 4, 8]: the same elements in
    # the same order, compared as such; [4] against [2, 2] stays a shape finding (above).
    x = torch.arange(8.0).reshape(2, 4)
    base = _trace([_rec(0, "a", shape=(2, 4))], {("a", "activation"): x})
    same = _trace([_rec(0, "a", shape=(1, 2, 4))], {("a", "activation"): x.reshape(1, 2, 4)})
    (pair,) = compare_traces(base, same, TABLE).pairs
    assert pair.status == "ok" and "differ only in dimensions of size 1" in pair.note
    other = _trace([_rec(0, "a", shape=(1, 2, 4))], {("a", "activation"): x.flip(1).reshape(1, 2, 4)})
    verdict = phase_verdict(compare_traces(base, other, TABLE), "forward", None, False)
    assert verdict.first is not None and verdict.first.metric == "allclose"
    assert same_elements((2, 4), (2, 1, 4, 1)) and not same_elements((2, 4), (4, 2))
