"""The Megatron-Core vs Hugging Face example suite end to end, serially and with -n 2."""

from __future__ import annotations

import json

import pytest

from tests.helpers.runs import ExampleSuite, RunPytest

pytest.importorskip("megatron.core")


def test_example_suite_passes_with_reasons_for_every_unmatched_record(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    folder = example_suite("qwen2_5_megatron_vs_hf")
    result = run_pytest("--align-config", str(folder / "align.yaml"), str(folder), "--align-report", "out")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 9, result.stdout.str()
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    for case in report["cases"]:
        for side in ("baseline", "candidate"):
            assert all(u["reason"] for u in case["unmatched"][side]), (case["name"], case["unmatched"][side])
    known = {c["name"]: c for c in report["cases"] if c["phase"] == "forward"}
    first = known["known_megatron_mlp_bug"]["first_divergence"]
    assert (first["name"], first["origin"]) == ("model.layers.1.mlp", True)
    assert known["known_megatron_mlp_bug_isolated"]["isolation"]["origin"] == "model.layers.1.mlp"
