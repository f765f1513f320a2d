"""What a failing training run that was not replayed says instead (``step_replay``): why,
and what to record to drill into its first divergent step by hand. No torch import."""

from __future__ import annotations

from dataclasses import replace

from ..verdict.training_run import TrainingVerdict


def to_record(step: int) -> str:
    """What to record to drill into ``step`` by hand."""
    return (
        f"record step {step} in tensor mode on both sides from equal state: "
        f'record: {{mode: tensor}} in a case, or Recorder(root, mode="tensor", steps=[{step}]) / '
        f'PrecalignCallback(root, mode="tensor", steps=[{step}]) in your own run, with the same '
        "parameters and optimizer state loaded on both sides"
    )


def not_replayed(verdict: TrainingVerdict | None, why: str) -> TrainingVerdict | None:
    """``verdict`` telling why its first divergent step was not replayed (unchanged when it
    passed, names no step, or already tells a replay)."""
    if verdict is None or verdict.first is None or verdict.passed or verdict.replay:
        return verdict
    return replace(verdict, replay=f"not replayed: {why}; to go further {to_record(verdict.first.step)}")
