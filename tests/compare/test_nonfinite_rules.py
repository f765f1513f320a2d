"""NaN/Inf where the other side has a finite value (or another NaN/Inf) fails the record
whatever bounds its rule gives: allclose, metric-only rules (the metrics count only the
elements finite on both sides), ``atol: .inf``; metrics over no finite element are not
comparable, never a pass. Statistics follow the same rule as far as they tell."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from pytest_precalign.compare.pairs import PairResult, compare_traces
from pytest_precalign.compare.tolerances import BOUND_METRICS, ToleranceRule, ToleranceTable
from pytest_precalign.reports.text import describe_check
from pytest_precalign.trace.records import Record, Stats, Trace
from pytest_precalign.verdict.phase import phase_verdict

NAN, INF = float("nan"), float("inf")

# Every form a rule's bounds can take: allclose, each msprobe metric alone, atol: .inf.
RULES = {
    "default": None,
    "allclose": ToleranceRule(atol=1e-3, rtol=1e-3),
    **{
        name: ToleranceRule(**{"bounds": ((name, 0.99 if not upper else 1e-3),)})  # type: ignore[arg-type]
        for name, upper in BOUND_METRICS.items()
    },
    "atol-inf": ToleranceRule(atol=INF, rtol=INF),
    "atol-inf-rtol-0": ToleranceRule(atol=INF, rtol=0.0),
    "allclose+cosine": ToleranceRule(atol=1e-3, rtol=1e-3, bounds=(("cosine", 0.99),)),
}


def _table(rule: ToleranceRule | None) -> ToleranceTable:
    return ToleranceTable("t", (rule,) if rule is not None else ())


def _tensor_pair(base: list[float], cand: list[float], rule: ToleranceRule | None) -> PairResult:
    def trace(values: list[float]) -> Trace:
        rec = Record(
            0, "m", "M", "forward", 0, 0, "activation", "out", "float32", (len(values),), tensor_key="t"
        )
        return Trace({"record_mode": "tensor"}, (rec,), {"t": torch.tensor(values)})

    (pair,) = compare_traces(trace(base), trace(cand), _table(rule)).pairs
    assert pair.evidence == "tensor"
    return pair


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
@pytest.mark.parametrize(
    "cand",
    [[NAN] * 4, [1.0, NAN, 3.0, 4.0], [1.0, 2.0, INF, 4.0], [-INF] * 4],
    ids=["all-nan", "one-nan", "one-inf", "all-minus-inf"],
)
def test_nonfinite_candidate_fails_under_every_rule(rule: ToleranceRule | None, cand: list[float]) -> None:
    pair = _tensor_pair([1.0, 2.0, 3.0, 4.0], cand, rule)
    assert pair.status == "fail"
    assert pair.failing is not None
    assert pair.failing.metric == "nonfinite" or math.isnan(pair.failing.value)


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_nonfinite_baseline_against_finite_candidate_fails(rule: ToleranceRule | None) -> None:
    assert _tensor_pair([1.0, NAN, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], rule).status == "fail"


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_nonfinite_at_other_positions_fails(rule: ToleranceRule | None) -> None:
    assert _tensor_pair([1.0, NAN, 3.0, 4.0], [1.0, 2.0, NAN, 4.0], rule).status == "fail"
    assert _tensor_pair([1.0, INF, 3.0, 4.0], [1.0, -INF, 3.0, 4.0], rule).status == "fail"


def _equal_nan(rule: ToleranceRule | None) -> ToleranceRule:
    return replace(rule or ToleranceRule(), equal_nan=True)


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_the_same_nonfinite_values_at_the_same_positions_fail_unless_the_rule_says_equal_nan(
    rule: ToleranceRule | None,
) -> None:
    """NaN is not a value (torch.testing.assert_close's equal_nan=False, issue #34 item 6):
    two sides broken alike are not aligned; ``equal_nan: true`` accepts it, and says so."""
    pair = _tensor_pair([1.0, NAN, INF, 4.0], [1.0, NAN, INF, 4.0], rule)
    assert pair.status == "fail" and pair.failing is not None, pair.checks
    assert (pair.failing.metric, pair.failing.value) == ("nonfinite_shared", 2.0)
    assert describe_check(pair.failing, pair).startswith(
        "2 NaN/Inf element(s) at the same places on both sides: NaN is not a value"
    )
    accepted = _tensor_pair([1.0, NAN, INF, 4.0], [1.0, NAN, INF, 4.0], _equal_nan(rule))
    assert accepted.status == "ok", accepted.checks
    assert describe_check(accepted.checks[0], accepted) == (
        "2 NaN/Inf element(s) at the same places on both sides, accepted by equal_nan: true"
    )


@pytest.mark.parametrize("metric", list(BOUND_METRICS))
def test_metrics_over_no_finite_element_are_not_comparable(metric: str) -> None:
    bound = 1e-3 if BOUND_METRICS[metric] else 0.99
    # equal_nan accepts the shared NaNs; metrics over nothing still say nothing.
    pair = _tensor_pair([NAN, NAN], [NAN, NAN], ToleranceRule(bounds=((metric, bound),), equal_nan=True))
    assert pair.status == "fail"
    assert pair.failing is not None and pair.failing.metric == metric and math.isnan(pair.failing.value)
    assert (
        describe_check(pair.failing, pair)
        == f"{metric} is not comparable: no element is finite on both sides"
    )


def test_an_all_nan_candidate_fails_the_phase_and_says_why() -> None:
    pair = _tensor_pair([1.0, 2.0], [NAN, NAN], ToleranceRule(bounds=(("cosine", 0.99),)))
    assert pair.failing is not None and pair.failing.metric == "nonfinite" and pair.failing.value == 2.0
    assert describe_check(pair.failing, pair) == "2 NaN/Inf element(s) differ between the sides"


def _stats_pair(base: Stats, cand: Stats, rule: ToleranceRule | None) -> PairResult:
    def trace(stats: Stats) -> Trace:
        rec = Record(0, "m", "M", "forward", 0, 0, "activation", "out", "float32", (4,), stats=stats)
        return Trace({"record_mode": "stats"}, (rec,))

    (pair,) = compare_traces(trace(base), trace(cand), _table(rule)).pairs
    assert pair.evidence == "stats"
    return pair


FINITE = Stats(max=4.0, min=1.0, mean=2.5, norm=5.5)


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
@pytest.mark.parametrize(
    "cand",
    [
        Stats(max=NAN, min=NAN, mean=NAN, norm=NAN),  # msprobe: no NaN count, NaN statistics
        Stats(max=INF, min=1.0, mean=INF, norm=INF),
        Stats(max=NAN, min=NAN, mean=NAN, norm=NAN, nan=4),
    ],
    ids=["nan-stats", "inf-max", "nan-count"],
)
def test_nonfinite_statistics_fail_under_every_rule(rule: ToleranceRule | None, cand: Stats) -> None:
    pair = _stats_pair(FINITE, cand, rule)
    assert pair.status == "fail"
    assert pair.failing is not None


def test_a_nonfinite_statistic_is_described() -> None:
    pair = _stats_pair(FINITE, Stats(max=NAN, min=1.0, mean=2.5, norm=5.5), None)
    assert pair.failing is not None and pair.failing.metric == "stats.max"
    assert describe_check(pair.failing, pair) == (
        "stats.max: nan (candidate) vs 4.0 (baseline): the NaN/Inf differ between the sides"
    )


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_the_same_nonfinite_statistics_fail_unless_the_rule_says_equal_nan(
    rule: ToleranceRule | None,
) -> None:
    same = Stats(max=INF, min=1.0, mean=INF, norm=INF, inf=1)
    pair = _stats_pair(same, same, rule)
    assert pair.status == "fail" and pair.failing is not None and pair.failing.metric == "nonfinite_shared"
    assert _stats_pair(same, same, _equal_nan(rule)).status == "ok"


def test_an_all_nan_candidate_fails_its_phase_under_atol_inf() -> None:
    def trace(values: list[float]) -> Trace:
        recs = tuple(
            Record(i, f"m{i}", "M", "forward", 0, 0, "activation", "out", "float32", (2,), tensor_key=f"t{i}")
            for i in range(2)
        )
        return Trace({"record_mode": "tensor"}, recs, {f"t{i}": torch.tensor(values) for i in range(2)})

    table = _table(ToleranceRule(atol=INF, rtol=INF))
    v = phase_verdict(compare_traces(trace([1.0, 2.0]), trace([NAN, NAN]), table), "forward", None, False)
    assert not v.passed and v.first is not None and v.first.metric == "nonfinite"
