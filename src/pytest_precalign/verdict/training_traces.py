"""The training-run verdict of two traces: each side's run record (``read_run_record``: its
per-step scalars, a trace without them giving its loss curve from its loss records; its
settings and plan; its initial parameters), and the per-step record evidence of their
comparison."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..compare.pairs import Comparison
from ..compare.tolerances import ToleranceTable
from ..trace.records import Trace
from ..trace.step_scalars import SCALARS_KEY, StepScalars
from ..trace.training_record import TRAINING_KEY, read_run_record
from .frozen_params import frozen_changes, frozen_of, without_frozen
from .training_contract import Rename, same_names
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
) -> TrainingVerdict:
    """The run verdict; ``candidate`` is in the baseline's names (its manifest is its own);
    ``envelope``: judged in the envelope lane."""
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
    return replace(verdict, findings=(*verdict.findings, *changed)) if changed else verdict
