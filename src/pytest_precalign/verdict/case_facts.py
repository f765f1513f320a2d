"""The manifest facts a case's verdict needs, taken once from its two traces (``case_facts``):
each side's run record (``Trace.run``: per-step scalars, settings and plan, initial
parameters, frozen parameters), the notes its recorder or merge wrote (``Trace.notes``: steps
whose parameter grads were gone, ranks that disagreed on a replicated record, steps left
incomplete by an interrupted run), and whether the case was stopped before step 0 (``not_trained``,
written by ``run.contract_check``). The verdict reads these, never the manifests again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..trace.records import Trace, is_training_run
from ..trace.trace_notes import TraceNotes
from ..trace.training_record import RunRecord

SIDES = ("baseline", "candidate")


@dataclass(frozen=True)
class SideFacts:
    """What one side's manifest says, as the verdict reads it."""

    side: str  # "baseline" or "candidate"
    run: RunRecord  # its training run's record (empty for a one-step case)
    notes: TraceNotes  # what its recorder, merge or the contract check noted (the steps it
    # recorded, steps left incomplete, parameter grads gone, replicas that disagreed,
    # ``not_trained``: why nothing was trained, "" when it was)
    own_scalars: bool  # its manifest holds per-step scalars (not only loss records)
    frozen: frozenset[str]  # the parameters its run froze


@dataclass(frozen=True)
class CaseFacts:
    """Both sides' facts and what the case's verdict takes from the baseline's manifest."""

    baseline: SideFacts
    candidate: SideFacts
    parents: Mapping[str, str]  # the baseline's module tree: module -> its parent
    dtype: str  # the runs' dtype (the table's rules by dtype)
    training_run: bool  # a training run (``trace.training_record.is_training_run``)

    @property
    def sides(self) -> tuple[SideFacts, SideFacts]:
        return self.baseline, self.candidate

    @property
    def not_trained(self) -> bool:
        """Stopped before step 0: nothing was trained or recorded, the plans are judged."""
        return bool(self.baseline.notes.not_trained or self.candidate.notes.not_trained)


def side_facts(trace: Trace, side: str) -> SideFacts:
    run, notes = trace.run, trace.notes
    settings = run.settings
    return SideFacts(
        side=side,
        run=run,
        notes=notes,
        own_scalars=bool(run.scalars),
        frozen=frozenset(settings.frozen or ()) if settings is not None else frozenset(),
    )


def case_facts(baseline: Trace, candidate: Trace) -> CaseFacts:
    """The facts of two traces of a case (the candidate's manifest its own)."""
    parents = baseline.manifest.get("parents") or {}
    return CaseFacts(
        baseline=side_facts(baseline, "baseline"),
        candidate=side_facts(candidate, "candidate"),
        parents={str(k): str(v) for k, v in parents.items()},
        dtype=str(baseline.manifest.get("dtype") or "float32"),
        training_run=is_training_run(baseline, candidate),
    )
