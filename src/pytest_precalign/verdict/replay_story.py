"""What the run verdict says of the replay of its first divergent step (``run.step_replay``):
what the replay found (``ReplayFinding``, told by ``story``), or why the step was not replayed
(``NotReplayed``) and what to record to drill into it by hand (``not_replayed``). No torch import."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .training_run import TrainingVerdict


@dataclass(frozen=True)
class ReplayFinding:
    """What replaying step ``step`` from the baseline's state found (``origin`` "" : nothing)."""

    step: int
    origin: str
    what: str  # a TrainingClass, or "none"
    evidence: str
    starts: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # side -> param -> sha1

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "from_step": self.step - 1 if self.step > 0 else None,
            "origin": self.origin or None,
            "phase": self.what,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class NotReplayed:
    """Why the first divergent step was not replayed (``reason``, in words: the sides are stored
    runs, launched, built by the test; the replay itself failed)."""

    reason: str


# What the run verdict is told of the replay: what it found, why it did not replay, or nothing
# (None: the case does not replay, or was not asked).
Replay = ReplayFinding | NotReplayed | None


def with_replay(verdict: TrainingVerdict | None, replay: Replay) -> TrainingVerdict | None:
    """``verdict`` telling the replay of its first divergent step (unchanged when it passed or
    names no step, or there is nothing to tell)."""
    if replay is None or verdict is None or verdict.first is None or verdict.passed:
        return verdict
    if isinstance(replay, NotReplayed):
        return not_replayed(verdict, replay.reason)
    return replace(verdict, replay=story(verdict, replay), replay_found=replay.as_dict())


def story(verdict: TrainingVerdict, finding: ReplayFinding) -> str:
    """``Step 5 diverged first (loss 5.57444 vs 5.57446); replayed from the baseline's state
    after step 4: origin model.layers.1.mlp (forward) — its inputs matched, its output did not``."""
    k = finding.step
    head = f"Step {k} diverged first ({_scalars_at(verdict, k)})"
    start = (
        f"replayed from the baseline's state after step {k - 1}"
        if k > 0
        else "replayed from the synced initial state in tensor mode"
    )
    if not finding.origin:
        return f"{head}; {start}: {finding.evidence}"
    return f"{head}; {start}: origin {finding.origin} ({finding.what}) — {finding.evidence}"


def _scalars_at(verdict: TrainingVerdict, step: int) -> str:
    """``loss a vs b`` at ``step`` from the run's curves, else what diverged."""
    curves = verdict.curves
    steps = list(curves.get("steps", ()))
    for name in ("loss", "lr", "grad_norm"):
        sides = curves.get(name) or {}
        base, cand = sides.get("baseline"), sides.get("candidate")
        if step in steps and base is not None and cand is not None:
            a, b = base[steps.index(step)], cand[steps.index(step)]
            if a is not None and b is not None and a != b:
                return f"{name} {a:.6g} vs {b:.6g}"
    assert verdict.first is not None
    return verdict.first.what


# The API each recorder's ``training.trainer`` names, to record a step's layers with.
RECORDING_API = {
    "hf_trainer": "PrecalignCallback(root, {args})",
    "lightning": "PrecalignLightningCallback(root, {args})",
    "accelerate": "AccelerateSteps(root, accelerator, model, optimizer, {args})",
    "recorder": "Recorder(root, {args})",
}


def to_record(step: int, trainers: tuple[str, ...] = ()) -> str:
    """What to record to drill into ``step`` by hand; ``trainers``: who recorded each side
    (the manifests' ``training.trainer``), whose API the hint names."""
    args = f'mode="tensor", steps=[{step}]'
    known = [RECORDING_API[t].format(args=args) for t in dict.fromkeys(trainers) if t in RECORDING_API]
    if known:
        how = " / ".join(known) + " in your run"
    else:
        how = (
            f"record: {{mode: tensor}} in a case, or Recorder(root, {args}) / "
            f"PrecalignCallback(root, {args}) in your own run"
        )
    return (
        f"record step {step} in tensor mode on both sides from equal state: {how}, with the same "
        "parameters and optimizer state loaded on both sides"
    )


def not_replayed(verdict: TrainingVerdict | None, why: str) -> TrainingVerdict | None:
    """``verdict`` telling why its first divergent step was not replayed (unchanged when it
    passed, names no step, or already tells a replay)."""
    if verdict is None or verdict.first is None or verdict.passed or verdict.replay:
        return verdict
    hint = to_record(verdict.first.step, verdict.recorded_with)
    return replace(verdict, replay=f"not replayed: {why}; to go further {hint}")
