"""--align-report writes compare_result.csv from the same document as report.json: serially,
and under -n 2 from the controller's merged document (one row per record pair of every item)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.helpers.report_suite import load_report, make_suite
from tests.helpers.runs import RunPytest


def test_align_report_writes_compare_result_csv(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    make_suite(pytester)
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out")
    result.assert_outcomes(passed=4, failed=2)
    out = pytester.path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["compare_result.csv", "report.html", "report.json"]
    with Path(out / "compare_result.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        header, rows = list(reader.fieldnames or []), list(reader)
    assert header[:8] == ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
                          "Bench Tensor Shape", "NPU Requires_grad", "Bench Requires_grad"]  # fmt: skip
    assert {"Cosine", "MaxAbsErr", "One Thousandth Err Ratio", "Five Thousandths Err Ratio", "NPU max",
            "Bench l2norm", "Result", "Err_message", "allowed", "rule", "origin"} <= set(header)  # fmt: skip

    document = load_report(out)
    expected = sorted((e["name"], e["phase"], r["name"], r["kind"], r["slot"]) for e in document["cases"]
                      for r in e["records"])  # fmt: skip
    got = sorted((r["case"], r["phase"], r["Bench Name"], r["kind"], r["slot"]) for r in rows)
    assert got == expected and {r["case"] for r in rows} == {"clean", "broken", "known"}
    by_case = {c: [r for r in rows if r["case"] == c] for c in ("clean", "broken")}
    assert all(r["Result"] == "pass" and r["Accuracy Reached or Not"] == "Yes" for r in by_case["clean"])
    broken = by_case["broken"]
    origin = [r for r in broken if r["origin"] == "origin"]
    assert [(r["phase"], r["Bench Name"]) for r in origin] == [("forward", "blocks.1")]
    assert origin[0]["Result"] == "error" and origin[0]["Err_message"].startswith("allclose ")
    assert origin[0]["rule"].startswith("rule match='*'") and "fp32 same-code budget" in origin[0]["rule"]
    assert float(origin[0]["value"]) > float(origin[0]["allowed"]) > 0
    assert float(origin[0]["NPU max"]) != float(origin[0]["Bench max"])  # the bug moves the output
