"""One story per case end to end: a forward fault is the case's origin in report.json (each
phase's entry carries it, also after xdist merged the workers' entries), the later phases are
downstream of it, and the failure messages open with it."""

from __future__ import annotations

import json

import pytest

from tests.helpers.nets import write_mlp_suite
from tests.helpers.runs import RunPytest


@pytest.mark.xdist_twin("the case origin after the controller merged the workers' entries")
def test_a_forward_fault_is_the_case_origin_in_report_json(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    write_mlp_suite(pytester.path, bug="between")
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out")
    result.assert_outcomes(failed=3)
    cases = {c["phase"]: c for c in json.loads((pytester.path / "out" / "report.json").read_text())["cases"]}
    origin = cases["forward"]["origin"]
    assert (origin["module"], origin["phase"], origin["kind"], origin["step"], origin["proven"]) == (
        "blocks.1",
        "forward",
        "activation",
        0,
        True,
    )
    assert origin["record"] == "blocks.1.up" and "up's input did not" in origin["evidence"]
    assert all(c["origin"] == origin for c in cases.values())
    assert cases["forward"]["downstream_of"] is None
    assert cases["backward"]["downstream_of"] == cases["step"]["downstream_of"] == "blocks.1 (forward)"
    # The per-phase first divergence stays, without an origin of its own downstream.
    assert cases["backward"]["first_divergence"]["origin"] is False
    text = result.stdout.str()
    assert "Origin: blocks.1 (forward, step 0) \u2014 its inputs and children norm matched" in text
    assert "Downstream of blocks.1 (forward, step 0): this phase follows from the case's origin" in text
    result.stdout.fnmatch_lines(["*FAILED port[[]backward[]]*downstream of blocks.1 (forward)*"])
    html = (pytester.path / "out" / "report.html").read_text()
    assert 'class="case-origin"' in html and "<code>blocks.1</code>" in html
