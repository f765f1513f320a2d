"""numpy views of tensors for comparing.

Comparisons run on numpy arrays so that an offline compare never imports torch (see
``tensor_files``); a recorded CPU tensor becomes an array without a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def as_numpy(value: Any) -> np.ndarray:
    """A numpy array for an ndarray or a torch tensor (detached, on the CPU; bfloat16, which
    numpy lacks, widened to float32 exactly)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # a torch.Tensor; torch is already imported if we have one
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return np.asarray(t.numpy())
    return np.asarray(value)
