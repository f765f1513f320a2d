"""Run records for verdict tests that judge plans by hand."""

from __future__ import annotations

from pytest_precalign.trace.training_record import TrainingPlan, TrainingSettings


def planned(plan: TrainingPlan) -> TrainingSettings:
    """The settings of a side whose recorder wrote ``plan`` and nothing else of its trainer."""
    return TrainingSettings(trainer="test", framework="", framework_version="", plan=plan)
