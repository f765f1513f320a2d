"""The manifest facts of a case, taken once from its two traces (``case_facts``, at the start
of ``run.outcome.finish``): each side's run record (``Trace.run``: per-step scalars, settings
and plan, initial parameters, frozen parameters), whether our ``Recorder`` recorded it, and the
notes its recorder or merge wrote (``Trace.notes``: steps whose parameter grads were gone, ranks
that disagreed on a replicated record, steps left incomplete by an interrupted run, records its
DP replicas or TP ranks could not join). ``run.both_recorded`` and the verdict read these, never
the manifests again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..parallel.layout import RECORDER_KEY
from ..trace.note_blocks import IncompleteStep, MissingGrads, ReplicaMismatch
from ..trace.records import Trace, is_training_run
from ..trace.trace_notes import TraceNotes
from ..trace.training_record import RunRecord

SIDES = ("baseline", "candidate")


@dataclass(frozen=True)
class SideFacts:
    """What one side's manifest says, as the verdict reads it."""

    side: str  # "baseline" or "candidate"
    run: RunRecord  # its training run's record (empty for a one-step case)
    notes: TraceNotes  # what its recorder or merge noted (``Trace.notes``; the fields below
    # are the notes the verdict reads, typed)
    own_scalars: bool  # its manifest holds per-step scalars (not only loss records)
    frozen: frozenset[str]  # the parameters its run froze
    steps: tuple[int, ...]  # the steps it recorded (the manifest's ``steps``)
    incomplete_steps: tuple[IncompleteStep, ...]  # steps its interrupted run left partial
    grads_missing: tuple[MissingGrads, ...]  # steps whose parameter grads were gone
    replica_mismatches: tuple[ReplicaMismatch, ...]  # replicated records its ranks disagreed on
    recorder: bool  # recorded by our ``Recorder`` or a callback (the manifest's ``RECORDER_KEY``)
    not_recordable: Mapping[str, str]  # record id -> why its grad could not be recorded
    dp_unpaired: Mapping[str, str]  # record id -> why its DP replicas were not joined on it
    tp_unmerged: Mapping[str, str]  # record id -> why its DTensor TP ranks were not merged on it


@dataclass(frozen=True)
class CaseFacts:
    """Both sides' facts and what the case's verdict takes from the baseline's manifest."""

    baseline: SideFacts
    candidate: SideFacts
    parents: Mapping[str, str]  # the baseline's module tree: module -> its parent
    dtype: str  # the runs' dtype (the table's rules by dtype)
    training_run: bool  # a training run (``trace.training_record.is_training_run``)
    # Both sides are runs our ``Recorder`` (or ``PrecalignCallback``) recorded with per-step
    # scalars, which may hold layers on some steps only (a case records the same on both).
    recorded_runs: bool

    @property
    def sides(self) -> tuple[SideFacts, SideFacts]:
        return self.baseline, self.candidate


def side_facts(trace: Trace, side: str) -> SideFacts:
    run, notes = trace.run, trace.notes
    settings = run.settings
    return SideFacts(
        side=side,
        run=run,
        notes=notes,
        own_scalars=bool(run.scalars),
        frozen=frozenset(settings.frozen or ()) if settings is not None else frozenset(),
        steps=notes.steps,
        incomplete_steps=notes.incomplete_steps,
        grads_missing=notes.grads_missing,
        replica_mismatches=notes.replica_mismatches,
        recorder=RECORDER_KEY in trace.manifest,
        not_recordable=notes.not_recordable,
        dp_unpaired={rid: why for block in notes.dp_join.values() for rid, why in block.unpaired.items()},
        tp_unmerged=notes.tp_unmerged,
    )


def case_facts(baseline: Trace, candidate: Trace) -> CaseFacts:
    """The facts of two traces of a case (the candidate's manifest its own)."""
    parents = baseline.manifest.get("parents") or {}
    sides = side_facts(baseline, "baseline"), side_facts(candidate, "candidate")
    return CaseFacts(
        baseline=sides[0],
        candidate=sides[1],
        parents={str(k): str(v) for k, v in parents.items()},
        dtype=str(baseline.manifest.get("dtype") or "float32"),
        training_run=is_training_run(baseline, candidate),
        recorded_runs=all(side.recorder and side.own_scalars for side in sides),
    )
