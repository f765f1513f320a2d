"""The one place where the recording path turns a tensor into Python numbers.

On a GPU or NPU every such conversion (``.tolist()``, ``.item()``, ``float(t)``) waits for
the device: a host synchronisation. The recorder, its statistics and the tensor summaries
call ``to_host`` for every conversion, so the number per recorded step can be counted
(``host_syncs()``) and kept constant: the recorder fetches a step's statistics in one call
(see ``step_buffer.py``). The one exception reads CPU tensors only, which are in host memory
and wait for nothing: a CPU tensor's statistics read at capture to decide whether its NaN/Inf
counts are needed (``tensor_summary.stats_row``)."""

from __future__ import annotations

import threading
from typing import Any

import torch

_lock = threading.Lock()
_count = [0]


def to_host(t: torch.Tensor) -> Any:
    """``t.tolist()`` (a Python number for a 0-d tensor), counted as one host sync."""
    with _lock:
        _count[0] += 1
    return t.tolist()


def host_syncs() -> int:
    """How many ``to_host`` calls this process made so far (differences count a region)."""
    return _count[0]
