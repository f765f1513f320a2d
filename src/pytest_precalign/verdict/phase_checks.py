"""What a phase verdict was checked against instead of alignment (``PhaseVerdict.expectation``),
as facts: the case's ``expect:`` in this phase, met or not, with the first divergence found
(``ExpectationChecked``); or records not gated (``NotGated``): the run's expected divergence
judges the case, the phase is downstream of an expected divergence, or neither side recorded
the phase and the run's per-step scalars judge it. The words are made when rendered
(``reports.expectation_text``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..specs.expectation import Expectation
from ..vocabulary import Kind, Phase


@dataclass(frozen=True)
class ExpectationChecked:
    """The case's ``expect:`` in this phase: ``met``, against ``found``, the phase's first
    divergence as (name, origin, kind) (None: the phase is aligned)."""

    expect: Expectation
    met: bool
    found: tuple[str, bool, Kind] | None


@dataclass(frozen=True)
class NotGated:
    """``phase``'s records are not gated: the run's expected divergence judges the case
    (``by_run``), the phase follows the expected divergence's (``downstream``), or neither side
    recorded a record of it and the run's per-step scalars judge it (``by_scalars``)."""

    why: Literal["by_run", "downstream", "by_scalars"]
    phase: Phase


PhaseCheck = ExpectationChecked | NotGated
