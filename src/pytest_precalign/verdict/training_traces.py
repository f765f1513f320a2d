"""The training-run verdict of two traces: each side's run record (``case_facts``: its
per-step scalars, a trace without them giving its loss curve from its loss records; its
settings and plan; its initial parameters), and the per-step record evidence of their
comparison.

Two recordings of a run made in different modes or on different steps are compared on what
both hold (``run.both_recorded``): the layers of a step that one side recorded as scalars only
are not compared (the verdict says so: ``not_compared``, ``one_side_only``), and a phase
neither side has a record of is judged by the run's scalars (``judged_by_scalars``). A step one
side did not record at all, or a scalar one side lacks, stays a finding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..compare.pairs import Comparison
from ..compare.tolerances import ToleranceTable
from ..trace.records import Trace
from ..trace.step_scalars import StepScalars
from ..trace.training_record import RunRecord
from ..vocabulary import Phase
from .case_facts import CaseFacts, SideFacts
from .frozen_params import frozen_changes
from .not_compared import KindsNotRecorded, not_compared
from .phase import PhaseVerdict
from .phase_checks import NotGated
from .training_contract import Rename, same_names
from .training_envelope import Envelope
from .training_records import losses_from_records, step_records
from .training_run import TrainingVerdict, judge_run


def judged_by_scalars(verdict: PhaseVerdict, phase: Phase) -> PhaseVerdict:
    """A phase of two recorded runs (``run.both_recorded``) of which neither side holds a record
    (scalars mode, or layers on other steps only): the run's verdict judges it (carried by the
    item of its class's phase); nothing compared is no failure of the phase here."""
    return replace(
        verdict,
        passed=True,
        coverage=None,
        expectation=NotGated("by_scalars", phase),
    )


def run_side(facts: SideFacts, trace: Trace, recorded: bool = True) -> RunRecord:
    """One side of the run; ``recorded`` False: its loss curve from its loss records even
    where the manifest has scalars (the other side recorded none)."""
    record = facts.run
    own = record.scalars if recorded else {}
    scalars: Mapping[int, StepScalars] = own or losses_from_records(trace)
    return replace(record, scalars=scalars)


def judge_traces(
    facts: CaseFacts,
    baseline: Trace,
    candidate: Trace,
    comparison: Comparison,
    table: ToleranceTable,
    rename: Rename = same_names,
    envelope: Envelope | None = None,
    alone: Mapping[str, Sequence[int]] | None = None,
    split: Sequence[int] = (),
    not_recorded: Mapping[str, KindsNotRecorded] | None = None,
) -> TrainingVerdict:
    """The run verdict; ``candidate`` is in the baseline's names (its manifest is its own);
    ``comparison`` without the parameters both sides freeze (``frozen_params``);
    ``envelope``: judged in the envelope lane; ``alone`` and ``split``: the steps whose layers
    one side only recorded or the sides split (``run.both_recorded``), and ``not_recorded``, the
    kinds of record one side could not take, told as not compared."""
    # A side that records no per-step scalars at all (a launched side stepping with torch.optim,
    # an msprobe dump) is compared on both sides' loss records: its missing scalars are what
    # its machinery does not record, not a step it skipped. One scalar missing of several stays
    # a finding (training_scalars).
    base, cand = facts.sides
    both = base.own_scalars == cand.own_scalars
    changed = frozen_changes(baseline, base.frozen, "baseline", base.run.initial_params) + frozen_changes(
        candidate, cand.frozen, "candidate", cand.run.initial_params
    )
    verdict = judge_run(
        run_side(base, baseline, both),
        run_side(cand, candidate, both),
        step_records(comparison, facts.parents),
        table,
        rename,
        dtype=facts.dtype,
        envelope=envelope,
    )
    if changed:
        verdict = replace(verdict, findings=(*verdict.findings, *changed))
    if not alone and not split and not not_recorded:
        return verdict
    layers = {side: list(steps) for side, steps in (alone or {}).items()}
    lines = not_compared(alone or {}, split, baseline.notes.dp_split, not_recorded)
    if not alone and not split:  # kinds one side could not take only
        return replace(verdict, not_compared=lines)
    return replace(verdict, not_compared=lines, one_side_only={"layers": layers})
