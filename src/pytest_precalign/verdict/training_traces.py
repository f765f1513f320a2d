"""The training-run verdict of two traces: each side's per-step scalars (the manifest's
``"scalars"``; a trace without them gives its loss curve from its loss records), its plan
(``"training"."plan"``) and initial parameters (``"initial_params"``), and the per-step
record evidence of their comparison."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..compare.pairs import Comparison
from ..compare.tolerances import ToleranceTable
from ..trace.records import Trace
from ..trace.step_scalars import StepScalars, scalars_of
from ..untrusted import bounded_repr
from .training_contract import Rename, same_names
from .training_envelope import Envelope
from .training_records import losses_from_records, step_records
from .training_run import RunSide, TrainingVerdict, judge_run


def is_training_run(baseline: Trace, candidate: Trace) -> bool:
    """Two traces of a training run: scalars or a plan on either side, or records of more
    than one optimizer step."""
    for trace in (baseline, candidate):
        if trace.manifest.get("scalars") or trace.manifest.get("training"):
            return True
    steps = {r.step for r in baseline.records if r.kind == "param"}
    return len(steps) > 1


def run_side(trace: Trace, where: str, recorded: bool = True) -> RunSide:
    """One side of the run; ``recorded`` False: its loss curve from its loss records even
    where the manifest has scalars (the other side recorded none)."""
    manifest = trace.manifest
    own = scalars_of(manifest, where) if recorded else {}
    scalars: Mapping[int, StepScalars] = own or losses_from_records(trace)
    training = manifest.get("training")
    plan = training.get("plan") if isinstance(training, Mapping) else None
    initial = manifest.get("initial_params")
    unusable = tuple(
        f"{key} is {bounded_repr(value)}, not an object: {what} cannot use it"
        for key, value, what in (
            ("initial_params", initial, "the initial weights check"),
            ("training.plan", plan, "the contract check"),
        )
        if value is not None and not isinstance(value, Mapping)
    )
    return RunSide(
        scalars,
        plan if isinstance(plan, Mapping) else None,
        initial if isinstance(initial, Mapping) else None,
        unusable,
    )


def judge_traces(
    baseline: Trace,
    candidate: Trace,
    comparison: Comparison,
    table: ToleranceTable,
    rename: Rename = same_names,
    envelope: Envelope | None = None,
) -> TrainingVerdict:
    """The run verdict; ``candidate`` is in the baseline's names (its manifest is its own);
    ``envelope``: judged in the envelope lane."""
    parents: Mapping[str, Any] = baseline.manifest.get("parents") or {}
    # A side that records no per-step scalars at all (a launched side stepping with torch.optim,
    # an msprobe dump) is compared on both sides' loss records: its missing scalars are what
    # its machinery does not record, not a step it skipped. One scalar missing of several stays
    # a finding (training_scalars).
    both = bool(baseline.manifest.get("scalars")) == bool(candidate.manifest.get("scalars"))
    return judge_run(
        run_side(baseline, "the baseline's manifest", both),
        run_side(candidate, "the candidate's manifest", both),
        step_records(comparison, {str(k): str(v) for k, v in parents.items()}),
        table,
        rename,
        dtype=str(baseline.manifest.get("dtype") or "float32"),
        envelope=envelope,
    )
