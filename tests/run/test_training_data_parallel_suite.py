"""example_suites/training's data-parallel cases: HF's Trainer vs megatron-core's stack on 2 DP
replicas with the distributed optimizer (torchrun, gloo) is aligned over 10 steps under the
suite's fp32 table; with the replicas' grads summed instead of averaged the run verdict names
grad_reduction at step 0."""

from __future__ import annotations

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.run.case import run_case
from tests.helpers.paths import REPO

pytest.importorskip("megatron.core")

SUITE = REPO / "example_suites" / "training" / "align.yaml"


@pytest.mark.slow  # two 10-step runs of 2 ranks under torchrun; tox -e slow
def test_dp2_is_aligned_and_summed_dp_grads_are_named_grad_reduction() -> None:
    config = load_config(SUITE.read_text(encoding="utf-8"), SUITE)
    clean = run_case(config, config.case("hf_trainer_vs_megatron_dp2_launched"))
    assert clean.training is not None and clean.training.passed, (
        clean.training.first,
        clean.training.findings,
    )
    assert clean.training.steps_compared == 10
    assert all(v.passed for v in clean.verdicts.values())
    summed = run_case(config, config.case("dp_grads_summed_launched"))
    assert summed.training is not None and summed.training.first is not None
    assert (summed.training.first.step, summed.training.first.what) == (0, "grad_reduction")
    assert summed.training.met
