"""What a case expects to find: a known divergence the verdict must confirm."""

from __future__ import annotations

from dataclasses import dataclass

from ..vocabulary import Kind, Phase


@dataclass(frozen=True)
class Expectation:
    """A known divergence: the case passes only when exactly this is found."""

    phase: Phase
    first_divergence: str
    origin: bool | None
    kind: Kind | None
    where: str
