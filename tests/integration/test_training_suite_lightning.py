"""example_suites/training's Lightning cases (``training: lightning``): a clean Lightning vs
``transformers.Trainer`` case aligns over its 10 steps; a plain user's Lightning -- AdamW
with torch's default weight decay 0.01 vs the Trainer's 0.0, the loss a mean of micro-batch
means vs the Trainer's per-token normalisation on micro-batches of 30 and 6 tokens -- is
stopped before step 0 with exactly that setting named (their ``expect:``), nothing trained and
no layer blamed."""

from __future__ import annotations

import pytest

from pytest_precalign.reports.training_evidence_text import evidence_text

from .test_training_suite_faults import _run

pytest.importorskip("lightning")
pytest.importorskip("accelerate")


@pytest.mark.parametrize(
    ("name", "origin", "evidence"),
    [
        ("lightning_torch_adamw_default_weight_decay", "weight_decay", "0 vs 0.01"),
        (
            "lightning_mean_of_micro_batch_means",
            "loss_normalisation",
            "'per_token_over_step' vs 'mean_of_micro_batch_means'",
        ),
    ],
)
def test_a_plain_users_lightning_is_named_as_a_setting_at_step_0(
    name: str, origin: str, evidence: str
) -> None:
    run, passed = _run(name)
    assert all(passed)  # the case's expect: met, so its phases pass
    training = run.training
    assert training is not None and training.met and training.first is not None
    first = training.first
    assert (first.step, first.what, first.origin, training.steps_compared) == (0, "settings", origin, 0)
    assert evidence in evidence_text(first.evidence)
    assert run.baseline.records == () and run.candidate.records == ()  # nothing trained, no layer


@pytest.mark.slow  # 10 steps of a Trainer and a Lightning fit (~75 s on a loaded 2-core machine)
def test_a_clean_lightning_vs_trainer_case_aligns_every_step() -> None:
    run, passed = _run("lightning_vs_hf_trainer")
    assert all(passed), run.verdicts
    assert run.training is not None and run.training.first is None and run.training.steps_compared == 10
    assert run.candidate.manifest["training"]["trainer"] == "lightning"
