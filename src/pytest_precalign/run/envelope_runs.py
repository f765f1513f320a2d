"""The noise-envelope lane's clean reruns: a case's baseline run again ``envelope.reruns``
times in this process, each from a fresh build of its model, with deterministic algorithms
off (what a clean rerun of the same stack may differ by), and the spread of each per-step
scalar over them is what the verdict measures (``verdict.training_envelope``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..config.specs import CaseSpec, ModelSpec
from ..verdict.training_envelope import CleanReruns
from .live import LiveCase


@contextmanager
def nondeterministic() -> Iterator[None]:
    """Deterministic algorithms off while inside (the case's setting restored after)."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cudnn = torch.backends.cudnn.deterministic
    try:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic = cudnn


def baseline_envelope(live: LiveCase, spec: ModelSpec, case: CaseSpec) -> CleanReruns | None:
    """The clean reruns of the case's baseline run (None: the case has no ``envelope:``)."""
    if case.training.envelope is None:
        return None
    reruns = []
    for rerun in range(case.training.envelope.reruns):
        with nondeterministic():
            model = live.build(spec)
            manifest = live.manifest(spec, side="baseline", model=spec.name, rerun=rerun + 1)
            reruns.append(live.record(model, spec, manifest).scalars)
        del model
    return CleanReruns(case.training.envelope, tuple(reruns))
