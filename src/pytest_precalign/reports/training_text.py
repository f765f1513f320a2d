"""A training run's verdict in words: the first divergent step, what diverged first and its
origin, the whole-model pattern, that later steps are downstream, the lane, and what does not
line up between the runs."""

from __future__ import annotations

from ..verdict.replay_finding import NotReplayed, ReplayFinding
from ..verdict.run_findings import PlanMissing
from ..verdict.training_run import ExpectedRun, TrainingVerdict
from .envelope_text import envelope_text
from .not_compared_text import not_compared_text
from .replay_text import replay_text
from .run_pattern_text import pattern_text
from .training_evidence_text import evidence_text, finding_text, warning_text

LAYER_CLASSES = ("forward", "backward", "forward_or_backward")
# How steps are counted, said with every run story (the Trainer's own logs count from 1).
STEPS_ARE = "(0-based optimizer steps; a Trainer logs step k as k+1)"


def training_lines(v: TrainingVerdict) -> list[str]:
    """The run's story, first lines of a failing item's message."""
    warned = [f"Warning: {warning_text(w)}" for w in v.warnings]
    if v.first is None and not v.findings and v.met is None:
        return [f"Training: {v.steps_compared} step(s) aligned ({v.lane} lane)", *warned]
    # Evidence one side lacks comes first: any story after it was told without that evidence.
    lines = [f"Warning: {warning_text(w)}" for w in v.warnings if isinstance(w, PlanMissing)]
    warned = [f"Warning: {warning_text(w)}" for w in v.warnings if not isinstance(w, PlanMissing)]
    lines += [f"Runs do not line up: {finding_text(finding)}" for finding in v.findings]
    if v.met is False:
        found = f"step {v.first.step} {v.first.what} ({v.first.origin})" if v.first else "no divergence"
        lines.append(f"Known divergence not reproduced: expected {_expected(v)}, found {found}")
    first = v.first
    if first is not None:
        own = f"{first.what}, origin {first.origin} — {evidence_text(first.evidence)}"
        if isinstance(v.replay, ReplayFinding):  # the replay's story leads; the run's own records follow
            lines += [replay_text(v), f"  the run's records at step {first.step}: {own}"]
        else:
            lines.append(f"Step {first.step} diverged first: {own}")
        if first.pattern is not None:
            lines.append(f"  whole model: {pattern_text(first.pattern)}")
        if isinstance(v.replay, NotReplayed):
            lines.append(f"  {replay_text(v)}")
        if downstream_text(v):
            lines.append(f"  {downstream_text(v)}")
        lines.append(f"  judged over {v.steps_compared} step(s) in the {v.lane} lane {STEPS_ARE}")
        if v.envelope is not None:
            lines.append(f"  {envelope_text(v.envelope)}")
    if v.met:
        lines.append(f"  the expected divergence: {_expected(v)}")
    lines.extend(f"Not compared: {not_compared_text(what)}" for what in v.not_compared)
    return lines + warned


def _expected(v: TrainingVerdict) -> str:
    return expected_text(v.expected) if v.expected is not None else ""


def expected_text(e: ExpectedRun) -> str:
    """``step 3 (lr[0]) schedule``: the case's expected run divergence."""
    return f"step {e.step} " + (f"({e.origin}) " if e.origin else "") + e.what


def downstream_text(v: TrainingVerdict) -> str:
    """``steps 4-9 are downstream of it`` ("" when the first divergent step is the last, or none)."""
    first = v.first
    if first is None or first.step >= v.last_step:
        return ""
    return f"steps {first.step + 1}-{v.last_step} are downstream of it"


def training_summary(v: TrainingVerdict) -> str:
    """``; step 3 diverged first: schedule (lr[0])`` for the summary line."""
    lacking = (
        f"; runs do not line up ({len(v.findings)} finding(s): {finding_text(v.findings[0])})"
        if v.findings
        else ""
    )
    if v.first is not None:
        return f"{lacking}; step {v.first.step} diverged first: {v.first.what} ({v.first.origin})"
    if v.findings:
        return lacking
    if v.warnings:
        return f"; warning: {warning_text(v.warnings[0])}" + (
            f" (+{len(v.warnings) - 1} more)" if len(v.warnings) > 1 else ""
        )
    return ""


def blames_layer(v: TrainingVerdict | None) -> bool:
    """Whether a layer origin may be told for the case: no training verdict, or one whose
    first divergence is in a layer (not the data, the settings, the schedule, ...)."""
    if v is None or v.first is None:
        return True
    return v.first.what in LAYER_CLASSES
