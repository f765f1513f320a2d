"""JUnit XML properties per item, and reports merged across xdist workers."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers.report_suite import EXPECTED, make_suite
from tests.helpers.runs import RunPytest


def _properties(junit: Path) -> dict[str, dict[str, str]]:
    """testcase name -> {property: value}"""
    root = ET.parse(junit).getroot()
    out = {}
    for case in root.iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        out[case.get("name", "")] = props
    return out


def _outcomes(junit: Path) -> dict[str, str]:
    root = ET.parse(junit).getroot()
    return {
        c.get("name", ""): "failed" if c.find("failure") is not None else "passed"
        for c in root.iter("testcase")
    }


def _args(tag: str) -> list[str]:
    return ["--align-config", "align.yaml", "--align-report", tag, f"--junitxml={tag}.xml"]


@pytest.mark.xdist_twin("reports merged from the workers, a worker that crashes")
def test_junit_xml_carries_verdict_first_divergence_origin_and_worst_metric(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    make_suite(pytester)
    run_pytest(*_args("out")).assert_outcomes(passed=4, failed=2)
    props = _properties(pytester.path / "out.xml")
    assert _outcomes(pytester.path / "out.xml") == {k: v[0] for k, v in EXPECTED.items()}
    assert {name: p["precalign_verdict"] for name, p in props.items()} == {
        k: v[1] for k, v in EXPECTED.items()
    }

    broken = props["broken[forward]"]
    assert broken["precalign_first_divergence"] == "blocks.1"
    assert broken["precalign_origin"] == "true"
    assert broken["precalign_origin_module"] == "blocks.1"
    assert broken["precalign_passed"] == "False"
    # name=value of the check closest to (here: furthest past) its bound: the +0.25 the bug adds
    # reaches the logits, whose allclose error is largest relative to its allowance.
    metric, value = broken["precalign_worst_metric"].split("=")
    assert metric == "allclose" and float(value) > 0.01
    assert props["broken[backward]"]["precalign_origin"] == "false"
    assert props["broken[backward]"]["precalign_first_divergence"] == "head"

    clean = props["clean[forward]"]
    assert clean["precalign_verdict"] == "passed" and clean["precalign_passed"] == "True"
    assert "precalign_first_divergence" not in clean and "precalign_origin" not in clean
    metric, value = clean["precalign_worst_metric"].split("=")
    assert metric == "allclose" and float(value) <= 1e-6  # within the suite's atol

    assert props["known[forward]"]["precalign_first_divergence"] == "blocks.1"


def _without_timings(report: dict) -> dict:
    cases = sorted(report["cases"], key=lambda c: c["nodeid"])
    return {**report, "cases": [{k: v for k, v in c.items() if k != "seconds"} for c in cases]}


@pytest.mark.xdist_twin("reports merged from the workers, a worker that crashes")
def test_xdist_report_has_every_case_and_equals_the_serial_report(
    pytester: pytest.Pytester, run_pytest: RunPytest, xdist: bool
) -> None:
    if not xdist:
        pytest.skip("compares an -n 2 run with a serial one: the xdist parametrization runs it")
    make_suite(pytester)
    parallel = run_pytest(*_args("parallel"), "-v")
    parallel.assert_outcomes(passed=4, failed=2)
    # Both workers ran items: the controller's report can only be complete by merging them.
    workers = set(re.findall(r"\[(gw\d)\] \[\s*\d+%\] (?:PASSED|FAILED) align.yaml::", parallel.stdout.str()))
    assert workers == {"gw0", "gw1"}, parallel.stdout.str()
    serial = pytester.runpytest_subprocess(*_args("serial"), "-p", "no:cacheprovider", "-p", "no:xdist")
    serial.assert_outcomes(passed=4, failed=2)

    for tag in ("parallel", "serial"):
        assert sorted(p.name for p in (pytester.path / tag).iterdir()) == [
            "compare_result.csv",
            "report.html",
            "report.json",
        ]
    par = json.loads((pytester.path / "parallel" / "report.json").read_text())
    ser = json.loads((pytester.path / "serial" / "report.json").read_text())
    assert sorted(f"{c['name']}[{c['phase']}]" for c in par["cases"]) == sorted(EXPECTED)
    assert _without_timings(par) == _without_timings(ser)
    # The page shows no timings: the merged report renders exactly as the serial one.
    assert (pytester.path / "parallel" / "report.html").read_text() == (
        pytester.path / "serial" / "report.html"
    ).read_text()
    # compare_result.csv too: written by the controller from the merged document.
    assert (pytester.path / "parallel" / "compare_result.csv").read_text() == (
        pytester.path / "serial" / "compare_result.csv"
    ).read_text()
    assert _properties(pytester.path / "parallel.xml") == _properties(pytester.path / "serial.xml")


@pytest.mark.xdist_twin("reports merged from the workers, a worker that crashes")
def test_a_crashed_worker_loses_only_the_item_it_was_running(pytester: pytest.Pytester, xdist: bool) -> None:
    if not xdist:
        pytest.skip(
            "a case that kills its process ends a serial pytest outright: only xdist can lose one item"
        )
    make_suite(pytester)
    config = pytester.path / "align.yaml"
    config.write_text(
        config.read_text().replace("  cand:", '  crashing: {source: factory, factory: "nets:crash"}\n  cand:')
        + "\n  - {name: dies, baseline: ref, candidate: crashing, inputs: toks, phases: [forward, backward],\n"
        "     record: {mode: tensor}, tolerances: tight}\n"
    )
    # One worker (-n 1, not the fixture's -n 2) runs the items in config order; the last case
    # kills it, twice.
    result = pytester.runpytest_subprocess(*_args("crashed"), "-p", "no:cacheprovider", "-n", "1")
    result.assert_outcomes(passed=4, failed=4)
    result.stdout.fnmatch_lines(["*worker*crashed while running*dies*"])
    cases = json.loads((pytester.path / "crashed" / "report.json").read_text())["cases"]
    assert sorted(f"{c['name']}[{c['phase']}]" for c in cases) == sorted(EXPECTED)
    assert sorted(p.name for p in (pytester.path / "crashed").iterdir()) == [
        "compare_result.csv",
        "report.html",
        "report.json",
    ]
