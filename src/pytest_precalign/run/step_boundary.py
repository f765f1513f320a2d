"""A step boundary inside a side's own training machinery: run steps ``0..step-1`` without
recording, call ``at(module, optimizer)`` where step ``step`` starts (after its RNG is
seeded, before its grads are zeroed), record step ``step`` and stop there. The drill-down
by replay (``step_replay``) captures and loads the baseline's state through it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Boundary:
    step: int
    at: Callable[[torch.nn.Module, Any], None]  # (the side's module, its torch optimizer)

    def quiet(self, step: int) -> bool:
        """Whether ``step`` runs without recording (before the boundary)."""
        return step < self.step

    def past(self, step: int) -> bool:
        """Whether ``step`` is after the boundary's (not run at all)."""
        return step > self.step
