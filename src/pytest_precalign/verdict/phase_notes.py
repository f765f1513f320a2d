"""What a side's run notes make of a phase verdict: the recorder found its parameter grads gone
(``grads_missing``), the ranks of a merged side disagreed on a replicated record
(``replica_mismatches``), the run was interrupted mid-step (``incomplete_steps``). Each fails
the phase; the verdict holds the notes, their words are made when rendered
(``reports.phase_notes_text``, ``reports.coverage_text`` for the grads gone)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..trace.note_blocks import MissingGrads, ReplicaMismatch
from .coverage import GradsMissing
from .phase import PartialStep, PhaseVerdict


def with_missing_grads(verdict: PhaseVerdict, missing: Mapping[str, Sequence[MissingGrads]]) -> PhaseVerdict:
    """The backward fails when a side's recorder found its parameter grads gone (``missing``:
    side -> the manifest's ``grads_missing`` notes): what was not recorded passed nothing."""
    if verdict.phase != "backward" or verdict.coverage is None:
        return verdict
    notes = tuple((side, m) for side, found in missing.items() for m in found)
    if not notes:
        return verdict
    return replace(verdict, passed=False, coverage=replace(verdict.coverage, problem=GradsMissing(notes)))


def with_replica_mismatches(verdict: PhaseVerdict, mismatches: Sequence[ReplicaMismatch]) -> PhaseVerdict:
    """The phase fails when the ranks of a merged side disagreed on a replicated record of it."""
    mine = tuple(m for m in mismatches if m.phase == verdict.phase)
    if not mine:
        return verdict
    return replace(verdict, passed=False, replica_mismatches=mine)


def with_incomplete_steps(verdict: PhaseVerdict, partial: Sequence[PartialStep]) -> PhaseVerdict:
    """Every phase fails when a side's run was interrupted mid-step: its complete steps were
    compared, the partial one was not, so no verdict can say the whole run is aligned."""
    if not partial:
        return verdict
    return replace(verdict, passed=False, incomplete_steps=tuple(partial))
