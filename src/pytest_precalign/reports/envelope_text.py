"""A training run verdict's envelope (the envelope lane's, ``TrainingVerdict.envelope``) in
words, made when the verdict is rendered ("" for a verdict of another lane)."""

from __future__ import annotations

from ..verdict.training_envelope import EnvelopeJudged


def envelope_text(judged: EnvelopeJudged | None) -> str:
    """``2 clean rerun(s), widest spread per scalar: loss 0.01; steps over it: 3 (steps_over allows 0)``."""
    if judged is None:
        return ""
    parts = ", ".join(f"{name} {spread:.3g}" for name, spread in judged.widest)
    steps = ", ".join(map(str, judged.over)) or "none"
    return (
        f"{judged.reruns} clean rerun(s), widest spread per scalar: {parts or 'none recorded'}; "
        f"steps over it: {steps} (steps_over allows {judged.allowed})"
    )
