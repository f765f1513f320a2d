"""The replay of a run's first divergent step in words, made when the verdict is rendered
(the verdict holds the typed ``Replay``: ``verdict.replay_finding``): what the replay found
(``story``), or why the step was not replayed and what to record to drill into it by hand
(``to_record``)."""

from __future__ import annotations

from ..verdict.replay_finding import NotReplayed, ReplayFinding, StepMatched
from ..verdict.training_run import TrainingVerdict
from .training_evidence_text import evidence_text


def replay_text(verdict: TrainingVerdict) -> str:
    """The replay of ``verdict``'s first divergent step in words ("" when it holds none)."""
    replay = verdict.replay
    if isinstance(replay, ReplayFinding):
        return story(verdict, replay)
    if isinstance(replay, NotReplayed) and verdict.first is not None:
        hint = to_record(verdict.first.step, verdict.recorded_with)
        return f"not replayed: {replay.reason}; to go further {hint}"
    return ""


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
        return f"{head}; {start}: {replay_evidence_text(finding)}"
    return f"{head}; {start}: origin {finding.origin} ({finding.what}) — {replay_evidence_text(finding)}"


def replay_evidence_text(finding: ReplayFinding) -> str:
    """What the replay found, in words."""
    told = finding.evidence
    if isinstance(told, StepMatched):
        k = told.step
        return (
            f"step {k} matched on equal state ({told.compared} records compared): what differs is the "
            f"state the candidate carried into step {k} (its parameters or optimizer state after "
            f"step {k - 1}), not step {k} itself"
        )
    return evidence_text(told)


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
