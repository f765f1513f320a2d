"""The per-step skeleton every case trainer runs its steps through (in process and on
launched ranks), the one place that, for each optimizer step: sets the recorder's step,
seeds the RNGs with ``seed + step`` (dropout, if any, draws the same numbers on both sides),
applies the step replay's boundary (``step_boundary``: a step past it is not run, a step
before it runs with the recorder paused, its own step calls ``boundary.at(module,
optimizer)`` where it starts) and records the parameters after the update (not on a quiet
step). A trainer calls ``begin`` where a step starts and ``updated`` after its optimizer
stepped, or iterates ``steps``; ``after_first_forward`` is isolation mode's call after step
0's first forward (given only to a trainer whose registry entry says ``isolation``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import torch

from ...recording import HookRecorder
from ...recording.determinism import seed_everything
from ..step_boundary import Boundary


class StepSkeleton:
    def __init__(
        self,
        recorder: HookRecorder | None,
        seed: int,
        boundary: Boundary | None = None,
        after_first_forward: Callable[[HookRecorder], None] | None = None,
    ) -> None:
        """``recorder``: None on a launched rank (its public ``Recorder`` counts its own
        steps and records the parameters when a step stops)."""
        self.recorder = recorder
        self.seed = seed
        self.boundary = boundary
        self.after_first_forward = after_first_forward
        self.quiet = False  # the current step runs unrecorded (before the boundary)
        self._pause = ExitStack()

    def count(self, steps: int) -> int:
        """How many of the case's ``steps`` run (through the boundary's step)."""
        return steps if self.boundary is None else min(steps, self.boundary.step + 1)

    def past(self, step: int) -> bool:
        """Whether ``step`` is after the boundary's: training stops before it."""
        return self.boundary is not None and self.boundary.past(step)

    def begin(self, step: int, module: torch.nn.Module, optimizer: Any = None) -> None:
        """Where ``step`` starts (before its grads are zeroed): the recorder's step, the
        seed, the boundary (``optimizer``: the torch optimizer it is handed)."""
        self.end()
        self.quiet = self.boundary is not None and self.boundary.quiet(step)
        if self.recorder is not None:
            if self.quiet:
                self._pause.enter_context(self.recorder.paused())
            self.recorder.step = step
        seed_everything(self.seed + step)
        if self.boundary is not None and step == self.boundary.step:
            self.boundary.at(module, optimizer)

    def updated(self) -> None:
        """After the step's optimizer update: the parameters recorded (not on a quiet step)."""
        if self.recorder is not None and not self.quiet:
            self.recorder.record_params()

    def end(self) -> None:
        """The step is over: a paused recorder records again."""
        self._pause.close()
        self.quiet = False

    def steps(
        self, steps: int, module: torch.nn.Module, optimizer: Callable[[], Any] | None = None
    ) -> Iterator[int]:
        """``begin`` each of the ``steps`` that run (``optimizer``: gives the torch optimizer
        handed to the boundary, asked for at the boundary's step only) and ``end`` it once the loop's body ran; the body calls
        ``updated`` after its update."""
        for step in range(self.count(steps)):
            at = self.boundary is not None and step == self.boundary.step
            self.begin(step, module, optimizer() if at and optimizer is not None else None)
            try:
                yield step
            finally:
                self.end()
