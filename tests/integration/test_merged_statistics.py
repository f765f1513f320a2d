"""The headline pair (HF Qwen2 vs megatron-core GPTModel) in statistics mode (issue #25, item 11):
Megatron's fused linear_qkv / linear_fc1 records meet HF's q/k/v (gate/up) records merged, so
that every phase pairs at least 85% of the baseline's output records; a fault in k alone,
inside the fused projection, is the first divergence, named as the merged q/k/v group, with
its evidence said to be merged statistics."""

from __future__ import annotations

import re

import pytest

from pytest_precalign.config.loader import load_config_file
from pytest_precalign.reports.coverage_text import coverage_text
from pytest_precalign.reports.text import PhaseReport, divergence_lines, summary_line
from pytest_precalign.run.case import run_case
from tests.helpers.paths import REPO

pytest.importorskip("megatron.core")

SUITE = REPO / "example_suites" / "qwen2_5_megatron_vs_hf" / "align.yaml"
QKV = "model.layers.0.self_attn.{q_proj,k_proj,v_proj}"


def test_the_headline_stats_case_pairs_85_percent_of_every_phase() -> None:
    config = load_config_file(SUITE)
    run = run_case(config, config.case("fp32_train_stats"))
    coverage = {phase: v.coverage for phase, v in run.verdicts.items()}
    assert all(v.passed for v in run.verdicts.values()), {
        p: coverage_text(c) for p, c in coverage.items() if c
    }
    for phase, cov in coverage.items():
        assert cov is not None and cov.ratio >= 0.85, (phase, cov)
        assert cov.merged > 0, (phase, cov)  # q/k/v and gate/up records of this phase, merged
    assert run.training is not None and run.training.passed  # the 2-step run verdict too
    paired = sum(c.paired for c in coverage.values() if c)
    outputs = sum(c.outputs for c in coverage.values() if c)
    assert paired / outputs >= 0.85
    report = PhaseReport.of_run(
        run, "forward", defined_in="align.yaml", baseline="hf", candidate="megatron", reproduce=""
    )
    # q, k, v, gate, up: 5 records per layer, 2 layers, 2 steps.
    assert re.search(r"; coverage \d+% \(20 by merged statistics\)", summary_line(report)), summary_line(
        report
    )
    merged = [p for p in run.comparison.pairs if p.evidence == "merged_stats"]
    assert {p.record.name for p in merged if p.record.step == 0 and p.record.kind == "param"} == {
        f"model.layers.{i}.{part}"
        for i in (0, 1)
        for part in (
            "self_attn.{q_proj,k_proj,v_proj}.weight",
            "self_attn.{q_proj,k_proj,v_proj}.bias",
            "mlp.{gate_proj,up_proj}.weight",
        )
    }


def test_a_fault_in_k_inside_the_fused_qkv_is_the_merged_groups_divergence() -> None:
    config = load_config_file(SUITE)
    run = run_case(config, config.case("known_k_bug_stats"))
    verdict = run.verdicts["forward"]
    first = verdict.first
    assert first is not None and (first.name, first.origin, first.evidence) == (QKV, True, "merged_stats")
    assert verdict.passed  # the case's expect: names the same group
    text = "\n".join(divergence_lines(first))
    assert "evidence is merged statistics" in text and "not element-wise" in text
    assert f"merged statistics of {QKV} (baseline) against one fused tensor (candidate)" in text
