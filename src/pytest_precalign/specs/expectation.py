"""What a case expects to find: a known divergence the verdict must confirm."""

from __future__ import annotations

from dataclasses import dataclass

from ..vocabulary import Kind, Phase, TrainingClass


@dataclass(frozen=True)
class Expectation:
    """A known divergence: the case passes only when exactly this is found."""

    phase: Phase
    first_divergence: str
    origin: bool | None
    kind: Kind | None
    where: str
    # A training run's known divergence: the first divergent step and what diverged first
    # (the case passes only when the run verdict finds exactly these; records are not gated).
    step: int | None = None
    diverged: TrainingClass | None = None
    run_origin: str | None = None  # the module, parameter or scalar the run verdict must name

    @property
    def of_run(self) -> bool:
        return self.diverged is not None
