"""The noise-envelope lane of the training-run verdict: the baseline run again ``reruns`` times
with determinism off (clean reruns of the same stack), the spread of each per-step scalar over
them measured, and the candidate's difference from the baseline at each step judged against
``factor`` x that spread (never below a floor), with ``steps_over`` steps allowed above it.

The spread of a scalar at a step is the largest |rerun - baseline| over the reruns. When the
reruns are bitwise equal (the usual case on CPU: the ops a tiny model runs are deterministic
even with determinism off), the spread is 0 and the floor decides: by default the case's
tolerance table (the approximate lane's bound for that scalar), or ``floor: <relative>``
(|a - b| <= floor x |a|), which can be tighter than the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..specs.envelope import EnvelopeSpec
from ..trace.step_scalars import StepScalars
from .scalar_evidence import EnvelopeQuote

# The scalars the envelope judges: every float a step computes from the run's numbers (LRs
# and weight decays are the plan's, judged to LR_RTOL; counts and hashes exactly).
ENVELOPE_SCALARS = ("loss", "grad_norm", "clip_coef", "update_norm", "param_norm")


@dataclass(frozen=True)
class CleanReruns:
    """The per-step scalars of a case's clean reruns of its baseline (``run.envelope_runs``),
    measured into its ``Envelope`` by the verdict."""

    spec: EnvelopeSpec
    scalars: tuple[Mapping[int, StepScalars], ...] = ()


@dataclass(frozen=True)
class Envelope:
    spec: EnvelopeSpec
    spreads: Mapping[str, Mapping[int, float]] = field(default_factory=dict)  # scalar -> step -> spread

    def spread(self, name: str, step: int) -> float:
        return self.spreads.get(name, {}).get(step, 0.0)

    def allowed(self, name: str, step: int, a: float, table_bound: float) -> float:
        """The largest |a - b| allowed for ``name`` at ``step`` (``a``: the baseline's value,
        ``table_bound``: the table's bound there, the floor when ``spec.floor`` is None)."""
        floor = table_bound if self.spec.floor is None else self.spec.floor * abs(a)
        return max(self.spec.factor * self.spread(name, step), floor)

    def quote(self, name: str, step: int, a: float, table_bound: float) -> EnvelopeQuote:
        """The envelope at a step, for a verdict's evidence (told in words when rendered)."""
        allowed = self.allowed(name, step, a, table_bound)
        spec = self.spec
        return EnvelopeQuote(name, self.spread(name, step), spec.reruns, allowed, spec.factor, spec.floor)

    def widest(self) -> tuple[tuple[str, float], ...]:
        """The widest spread of each scalar over the run, (scalar, spread) in the spreads' order."""
        return tuple((n, max(s.values(), default=0.0)) for n, s in self.spreads.items())


@dataclass(frozen=True)
class EnvelopeJudged:
    """The envelope lane's envelope and the steps over it, as facts (a verdict's ``envelope``;
    words made when rendered: ``reports.envelope_text``)."""

    reruns: int  # the clean reruns of the baseline it was measured over
    widest: tuple[tuple[str, float], ...]  # (scalar, its widest spread over the run)
    over: tuple[int, ...]  # the steps some scalar of which is over the envelope
    allowed: int  # how many steps ``steps_over`` allows over it


def measure_envelope(
    baseline: Mapping[int, StepScalars], reruns: Sequence[Mapping[int, StepScalars]], spec: EnvelopeSpec
) -> Envelope:
    """Each scalar's spread at each step: the largest |rerun - baseline| over ``reruns``."""
    spreads: dict[str, dict[int, float]] = {}
    for name in ENVELOPE_SCALARS:
        for step, base in baseline.items():
            a = getattr(base, name)
            if a is None:
                continue
            spread = 0.0
            for rerun in reruns:
                other = rerun.get(step)
                b = getattr(other, name) if other is not None else None
                if b is not None:
                    spread = max(spread, abs(float(b) - float(a)))
            spreads.setdefault(name, {})[step] = spread
    return Envelope(spec, spreads)
