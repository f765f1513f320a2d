"""The module calls the hook engine keeps track of: the call being recorded (``_Call``) and,
for isolation mode, the calls of step 0 kept to be called again (``ModuleCall``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def _version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # inference tensors have no version counter
        return -1


@dataclass(frozen=True)
class ModuleCall:
    """A module call of step 0, kept so isolation mode can call it again on other inputs."""

    name: str
    call: int
    module: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class _Call:
    name: str
    cls: str
    call: int
    step: int
    input_seqs: tuple[int, ...]  # the records of its inputs (``HookRecorder._records``)
    grad_output_seqs: list[int]
    recomputed: bool = False
    grads: bool = False  # grad hooks are registered for this call
