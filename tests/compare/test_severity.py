"""One rule for "how much of its allowance a check uses" and "which check explains a record",
shared by the verdict, the text report and the HTML chart (which reads report.json)."""

from __future__ import annotations

import math

import pytest

from pytest_precalign.compare.pairs import Check, PairResult, explaining_check, severity
from pytest_precalign.reports.chart import Row, rows_from_records
from pytest_precalign.reports.chart import fmt as chart_fmt
from pytest_precalign.reports.text import fmt_number
from pytest_precalign.trace.records import Record


@pytest.mark.parametrize(
    ("value", "allowed", "passed", "expected"),
    [
        (0.5, 1.0, True, 0.5),  # half the allowance
        (1.0, 1.0, True, 1.0),  # at the bound
        (3.0, 1.0, False, 3.0),  # three times the bound
        (0.0, 1.0, True, 0.0),
        (0.0, 0.0, True, 0.0),  # exact-equality checks (hashes, NaN/Inf counts): 0 is perfect
        (1.0, 0.0, False, math.inf),  # ... anything else is beyond the bound
    ],
)
def test_upper_bound_is_value_over_allowed(
    value: float, allowed: float, passed: bool, expected: float
) -> None:
    assert severity(value, allowed, True, passed) == pytest.approx(expected)
    assert Check("max_abs", value, allowed, passed).severity == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "allowed", "passed", "expected"),
    [
        (1.0, 0.999, True, 0.0),  # perfect similarity uses nothing
        (0.9999, 0.999, True, 0.1),  # a tenth of the allowed shortfall (allowed/value would say 0.999)
        (0.999, 0.999, True, 1.0),  # at the bound
        (0.99, 0.999, False, 10.0),  # ten times the allowed shortfall
        (1.0000001, 0.999, True, 0.0),  # rounding above 1 is perfect, not negative
        (0.0, 0.5, False, 2.0),  # a zero value is finite: the whole range below 1 is the shortfall
        (-1.0, 0.5, False, 4.0),  # opposite directions (cosine -1)
        (1.0, 1.0, True, 0.0),  # a bound of exactly 1: met
        (0.5, 1.0, False, math.inf),  # ... or not, by any amount
        (0.0, 0.0, True, 1.0),  # a bound of 0 allows everything; value 0 sits on it
    ],
)
def test_lower_bound_is_shortfall_from_one_over_allowed_shortfall(
    value: float, allowed: float, passed: bool, expected: float
) -> None:
    assert severity(value, allowed, False, passed) == pytest.approx(expected)
    assert Check("cosine", value, allowed, passed, upper=False).severity == pytest.approx(expected)


def test_a_failing_nan_is_past_its_bound() -> None:
    assert severity(math.nan, 1.0, True, False) == math.inf
    assert severity(math.nan, 0.9, False, False) == math.inf


def test_the_shape_check_keeps_its_count_ratio() -> None:
    """Element counts, not a bound (report.json has always carried this ratio)."""
    assert Check("shape", 4.0, 8.0, False).severity == 0.5


def test_a_passing_nan_uses_nothing() -> None:
    assert severity(math.nan, 1.0, True, True) == 0.0


def _pair(*checks: Check) -> PairResult:
    rec = Record(0, "m", "Linear", "forward", 0, 0, "activation", "out", "float32", (2,))
    status = "ok" if all(c.passed for c in checks) else "fail"
    return PairResult(rec, rec, status, "tensor", checks)


def test_explaining_check_is_the_first_failing_one() -> None:
    allclose = Check("allclose", 2.0, 1.0, False)
    bound = Check("max_abs", 50.0, 1.0, False)  # worse, but allclose comes first
    pair = _pair(allclose, bound)
    assert pair.explaining_check is allclose
    assert pair.failing is allclose
    assert pair.severity == 50.0


def test_explaining_check_of_a_passing_record_is_the_tightest_lower_bounds_included() -> None:
    allclose = Check("allclose", 0.2, 1.0, True)  # 20% of its bound
    cosine = Check("cosine", 0.9995, 0.999, True, upper=False)  # 50% of its allowed shortfall
    pair = _pair(allclose, cosine)
    assert pair.explaining_check is cosine
    assert pair.failing is None
    assert pair.severity == pytest.approx(0.5)


def test_no_checks() -> None:
    assert explaining_check(()) is None
    assert _pair().explaining_check is None
    assert _pair().severity == 0.0


def test_the_chart_applies_the_same_rule_to_report_json() -> None:
    """The chart's rows are built from report.json's dicts; they use compare's Check."""
    checks = [
        {"metric": "allclose", "value": 0.2, "allowed": 1.0, "passed": True, "upper": True},
        {"metric": "cosine", "value": 0.9995, "allowed": 0.999, "passed": True, "upper": False},
    ]
    (row,) = rows_from_records([{"name": "m", "kind": "activation", "status": "ok", "checks": checks}])
    assert isinstance(row, Row)
    assert row.shown == _pair(*row.checks).explaining_check
    assert row.shown is not None and row.shown.metric == "cosine"
    assert row.plotted is not None and row.plotted.metric == "allclose"  # lower bounds are not drawn


@pytest.mark.parametrize(
    ("x", "text", "chart"),
    [
        (0.0, "0", "0"),
        (0.00115605, "0.00115605", "0.001156"),
        (1.089e-06, "1.089e-06", "1.089e-06"),
        (123456.0, "1.235e+05", "1.235e+05"),
        (math.inf, "inf", "∞"),
        (-math.inf, "-inf", "−∞"),
        (math.nan, "nan", "NaN"),
    ],
)
def test_one_number_format_two_precisions(x: float, text: str, chart: str) -> None:
    assert fmt_number(x) == text
    assert chart_fmt(x) == chart
