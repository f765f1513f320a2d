"""The training-run verdict of two traces: each side's run record (``read_run_record``: its
per-step scalars, a trace without them giving its loss curve from its loss records; its
settings and plan; its initial parameters), and the per-step record evidence of their
comparison.

Two recordings of a run made in different modes or on different steps (a ``Recorder`` or
``PrecalignCallback`` recording every step's scalars, and layers on all steps, some or none)
are compared on what both hold: the layers of a step that one side recorded as scalars only
are not compared (``on_both``; the verdict says so: ``not_compared``, ``one_side_only``), and a
phase neither side has a record of is judged by the run's scalars (``judged_by_scalars``). A
step one side did not record at all, or a scalar one side lacks, stays a finding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..compare.pairs import Comparison
from ..compare.tolerances import ToleranceTable
from ..parallel.layout import RECORDER_KEY
from ..trace.records import Trace
from ..trace.step_scalars import SCALARS_KEY, StepScalars
from ..trace.training_record import TRAINING_KEY, read_run_record
from ..vocabulary import Phase
from .frozen_params import frozen_changes, frozen_of, without_frozen
from .phase import PhaseVerdict
from .training_contract import Rename, same_names, split_free
from .training_envelope import Envelope
from .training_records import losses_from_records, step_records
from .training_run import RunSide, TrainingVerdict, judge_run


def is_training_run(baseline: Trace, candidate: Trace) -> bool:
    """Two traces of a training run: scalars or a plan on either side, or records of more
    than one optimizer step."""
    for trace in (baseline, candidate):
        if trace.manifest.get(SCALARS_KEY) or trace.manifest.get(TRAINING_KEY):
            return True
    steps = {r.step for r in baseline.records if r.kind == "param"}
    return len(steps) > 1


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


SPLIT = "split"  # ``on_both``'s key of the steps the sides split into other micro-batches


def split_steps(baseline: Trace, candidate: Trace) -> list[int]:
    """The steps both sides recorded layers of, split into other micro-batch counts, where
    both plans normalise the loss per token over the step (``split_free``): the same rows, so
    the step's loss, grads and update are the same, but its module calls cannot be paired call
    by call."""
    plans = (read_run_record(baseline.manifest).plan, read_run_record(candidate.manifest).plan)
    if not split_free(*plans):
        return []
    base, cand = baseline.scalars, candidate.scalars
    both = layer_steps(baseline) & layer_steps(candidate)
    return sorted(
        s for s in both if s in base and s in cand and base[s].micro_batches != cand[s].micro_batches
    )


def recorded_runs(baseline: Trace, candidate: Trace) -> bool:
    """Both sides are runs our ``Recorder`` (or ``PrecalignCallback``) recorded with per-step
    scalars, which may hold layers on some steps only (a case records the same on both)."""
    return all(RECORDER_KEY in t.manifest and t.manifest.get(SCALARS_KEY) for t in (baseline, candidate))


def on_both(baseline: Trace, candidate: Trace) -> tuple[Trace, Trace, dict[str, list[int]]]:
    """Two recorded runs (``recorded_runs``) without the records of steps whose layers one
    side only recorded (see ``one_side_only``), and those steps by side; other traces as they
    are (a record without a partner fails its phase)."""
    recorded = recorded_runs(baseline, candidate)
    alone = one_side_only(baseline, candidate) if recorded else {}
    split = split_steps(baseline, candidate) if recorded else []
    if split:
        alone[SPLIT] = split
    if not alone:
        return baseline, candidate, alone
    drop = {s for side, steps in alone.items() if side != SPLIT for s in steps}
    calls = set(split)  # their parameters after the step stay compared

    def kept(trace: Trace) -> Trace:
        return replace(
            trace,
            records=tuple(
                r for r in trace.records if r.step not in drop and (r.step not in calls or r.kind == "param")
            ),
        )

    return kept(baseline), kept(candidate), alone


def judged_by_scalars(verdict: PhaseVerdict, phase: Phase) -> PhaseVerdict:
    """A phase of two recorded runs (``recorded_runs``) of which neither side holds a record
    (scalars mode, or layers on other steps only): the run's verdict judges it (carried by the
    item of its class's phase); nothing compared is no failure of the phase here."""
    return replace(
        verdict,
        passed=True,
        coverage=None,
        expectation=f"no {phase} records on either side: judged by the run's per-step scalars",
    )


def not_compared_lines(alone: Mapping[str, list[int]]) -> tuple[str, ...]:
    """What was not compared because one side lacks it, in words."""
    other = {"baseline": "candidate", "candidate": "baseline"}
    return tuple(
        f"the layers of step(s) {', '.join(map(str, steps))}: "
        + (
            "the sides split them into other micro-batches (module calls cannot be paired call "
            "by call; with the loss per token over the step the split is no difference: the "
            "steps' scalars and parameters are judged)"
            if side == SPLIT
            else f"the {side} recorded them, the {other[side]} those steps' scalars only"
        )
        for side, steps in alone.items()
    )


def run_side(trace: Trace, where: str, recorded: bool = True) -> RunSide:
    """One side of the run; ``recorded`` False: its loss curve from its loss records even
    where the manifest has scalars (the other side recorded none)."""
    record = read_run_record(trace.manifest, where)
    own = record.scalars if recorded else {}
    scalars: Mapping[int, StepScalars] = own or losses_from_records(trace)
    return RunSide(scalars, record.plan, record.initial_params, record.settings)


def judge_traces(
    baseline: Trace,
    candidate: Trace,
    comparison: Comparison,
    table: ToleranceTable,
    rename: Rename = same_names,
    envelope: Envelope | None = None,
    alone: Mapping[str, list[int]] | None = None,
) -> TrainingVerdict:
    """The run verdict; ``candidate`` is in the baseline's names (its manifest is its own);
    ``envelope``: judged in the envelope lane; ``alone``: the steps whose layers one side only
    recorded (``on_both``), told as not compared."""
    parents: Mapping[str, Any] = baseline.manifest.get("parents") or {}
    # A side that records no per-step scalars at all (a launched side stepping with torch.optim,
    # an msprobe dump) is compared on both sides' loss records: its missing scalars are what
    # its machinery does not record, not a step it skipped. One scalar missing of several stays
    # a finding (training_scalars).
    both = bool(baseline.manifest.get(SCALARS_KEY)) == bool(candidate.manifest.get(SCALARS_KEY))
    frozen = frozen_of(baseline), frozen_of(candidate)
    comparison = without_frozen(comparison, frozen[0] & frozen[1])  # checked unchanged instead
    changed = frozen_changes(baseline, frozen[0], "baseline") + frozen_changes(
        candidate, frozen[1], "candidate"
    )
    verdict = judge_run(
        run_side(baseline, "the baseline's manifest", both),
        run_side(candidate, "the candidate's manifest", both),
        step_records(comparison, {str(k): str(v) for k, v in parents.items()}),
        table,
        rename,
        dtype=str(baseline.manifest.get("dtype") or "float32"),
        envelope=envelope,
    )
    if changed:
        verdict = replace(verdict, findings=(*verdict.findings, *changed))
    if not alone:
        return verdict
    layers = {side: steps for side, steps in alone.items() if side != SPLIT}
    return replace(verdict, not_compared=not_compared_lines(alone), one_side_only={"layers": layers})
