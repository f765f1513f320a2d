"""Two recordings of a run made in different modes or on different steps (a ``Recorder`` or
``PrecalignCallback`` recording every step's scalars, and layers on all steps, some or none)
are compared on what both hold (``on_both``): the layers of a step that one side recorded as
scalars only are not compared, nor the module calls of a step the sides split into other
micro-batches; the verdict says so (``not_compared``, ``one_side_only``) and judges a phase
neither side has a record of by the run's scalars. A step one side did not record at all, or a
scalar one side lacks, stays a finding. The kinds of record a side could not take at all (under
``torch.compile``, stats mode records no module grads: its ``compiled`` note, ``Trace.notes``) are
compared on neither side (``not_recorded_kinds``), and the verdict says so. No torch import."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..parallel.dp_join import split_rows
from ..trace.records import Record, Trace
from ..trace.training_record import split_free
from ..verdict.case_facts import CaseFacts
from ..verdict.not_compared import KindsNotRecorded


@dataclass(frozen=True)
class OnBoth:
    """Two traces without the records of steps not compared (``on_both``)."""

    baseline: Trace
    candidate: Trace
    recorded: bool = False  # both are recorded runs (``CaseFacts.recorded_runs``)
    alone: dict[str, list[int]] = field(default_factory=dict)  # side -> steps whose layers only it recorded
    split: list[int] = field(default_factory=list)  # steps the sides split into other micro-batches
    not_recorded: dict[str, KindsNotRecorded] = field(default_factory=dict)  # kind -> why one side has none


def not_recorded_kinds(baseline: Trace, candidate: Trace) -> dict[str, KindsNotRecorded]:
    """The kinds of record a side could not take at all, each with why: the module grads of a
    stats-mode recording under ``torch.compile`` (its ``compiled`` note)."""
    out: dict[str, KindsNotRecorded] = {}
    for side, trace in (("baseline", baseline), ("candidate", candidate)):
        note = trace.notes.compiled
        kinds = note.not_recorded if note is not None else None
        by_why: dict[str, list[str]] = {}
        for kind, why in (kinds or {}).items():
            by_why.setdefault(why, []).append(kind)
        for why, named in by_why.items():
            for kind in named:
                out.setdefault(kind, KindsNotRecorded(tuple(named), side, why))
    return out


def _without_kinds(trace: Trace, kinds: Mapping[str, object]) -> Trace:
    return trace.with_records(tuple(r for r in trace.records if r.kind not in kinds))


def _reduced_grad(trace: Trace, rec: Record) -> bool:
    """A parameter grad recorded once per step as the optimizer sees it (``param_grads="step"``):
    the same however the step's rows were split."""
    return rec.kind == "param_grad" and trace.notes.param_grads == "step"


def layer_steps(trace: Trace) -> set[int]:
    """The steps a trace holds records (layers) of."""
    return {r.step for r in trace.records}


def one_side_only(baseline: Trace, candidate: Trace) -> dict[str, list[int]]:
    """Per side, the steps whose layers only it recorded while the other side recorded the
    step's scalars (that step in scalars mode, or outside its ``steps=``): not compared."""
    out: dict[str, list[int]] = {}
    for side, mine, other in (("baseline", baseline, candidate), ("candidate", candidate, baseline)):
        alone = sorted(layer_steps(mine) - layer_steps(other))
        recorded = other.scalars
        steps = [s for s in alone if s in recorded]
        if steps:
            out[side] = steps
    return out


def split_steps(baseline: Trace, candidate: Trace, facts: CaseFacts) -> list[int]:
    """The steps both sides recorded layers of, split into other micro-batch counts, where
    both plans normalise the loss per token over the step (``split_free``): the same rows, so
    the step's loss, grads and update are the same, but its module calls cannot be paired call
    by call."""
    if not split_free(facts.baseline.run.plan, facts.candidate.run.plan):
        return []
    base, cand = facts.baseline.run.scalars, facts.candidate.run.scalars
    both = layer_steps(baseline) & layer_steps(candidate)
    return sorted(
        s for s in both if s in base and s in cand and base[s].micro_batches != cand[s].micro_batches
    )


def on_both(baseline: Trace, candidate: Trace, facts: CaseFacts) -> OnBoth:
    """Two recorded runs (``CaseFacts.recorded_runs``; ``facts``: the traces') without the records of steps whose layers one
    side only recorded (see ``one_side_only``) and the module calls of split steps (their
    parameters after the step stay compared); other traces as they are (a record without a
    partner fails its phase)."""
    missing = not_recorded_kinds(baseline, candidate)
    if missing:
        baseline, candidate = _without_kinds(baseline, missing), _without_kinds(candidate, missing)
    recorded = facts.recorded_runs
    if not recorded:
        return OnBoth(baseline, candidate, not_recorded=missing)
    alone = one_side_only(baseline, candidate)
    rows = split_rows(baseline, candidate)  # DP replicas joined on one side, split otherwise
    split = sorted({*split_steps(baseline, candidate, facts), *rows})
    if not alone and not split:
        return OnBoth(baseline, candidate, recorded, not_recorded=missing)
    drop = {s for steps in alone.values() for s in steps}
    calls = set(split)

    def kept(trace: Trace) -> Trace:
        noted = trace.with_notes(dp_split={str(s): why for s, why in rows.items()}) if rows else trace
        return noted.with_records(
            tuple(
                r
                for r in trace.records
                if r.step not in drop
                and (r.step not in calls or r.kind == "param" or _reduced_grad(trace, r))
            )
        )

    return OnBoth(kept(baseline), kept(candidate), recorded, alone, split, missing)
