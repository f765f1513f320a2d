"""The xdist scheduler's unit: a case's phase items are one unit, anything else its own."""

from __future__ import annotations

import pytest

pytest.importorskip("xdist")

from pytest_precalign.case_scheduling import case_unit_pattern  # noqa: E402


@pytest.mark.parametrize(
    ("nodeid", "unit"),
    [
        ("align.yaml::port[forward]", "align.yaml::port"),
        ("suites/align.yaml::port[step]", "suites/align.yaml::port"),
        ("align.yaml::tp2-pp2_launched[backward]", "align.yaml::tp2-pp2_launched"),
        ("align.yaml::port[search]", None),  # hypothesis search: its own run, its own unit
        ("other.yaml::port[forward]", None),
        ("test_x.py::test_y[forward]", None),
        ("test_x.py::test_y", None),
    ],
)
def test_case_unit(nodeid: str, unit: str | None) -> None:
    match = case_unit_pattern("align.yaml").match(nodeid)
    assert (match.group("unit") if match else None) == unit
