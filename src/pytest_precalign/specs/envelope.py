"""A case's ``envelope:``: the run verdict's noise-envelope lane (``verdict/training_envelope``
measures and judges by it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvelopeSpec:
    """A case's ``envelope:``: the baseline rerun ``reruns`` times clean, the candidate allowed
    ``factor`` x each scalar's spread over them (never below ``floor`` x |baseline|; ``floor``
    None: the case's table), ``steps_over`` steps above it."""

    reruns: int = 2
    factor: float = 4.0
    steps_over: int = 0
    floor: float | None = None
