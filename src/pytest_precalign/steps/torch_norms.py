"""The total norm of a list of tensors and clipping by a given norm, as torch computes them in
``clip_grad_norm_``, on every torch the project supports (``torch>=2.4``, pyproject).

torch 2.6 split ``clip_grad_norm_`` in two public functions, ``torch.nn.utils.get_total_norm``
and ``clip_grads_with_norm_``; torch 2.4 and 2.5 have neither, only the same arithmetic inside
``clip_grad_norm_`` (read from the 2.4.1 and 2.5.1 wheels, ``torch/nn/utils/clip_grad.py``):
the tensors grouped by device and dtype, ``torch._foreach_norm`` of each group, the norm of the
stacked norms; clipping multiplies every grad by ``clamp(max_norm / (norm + 1e-6), max=1)``.
Used where torch has no public function for it, so a run recorded under an older torch (a
torch bug's buggy release, ``benchmarks/real_bugs/sdpa_fully_masked_rows_nan.py``) measures
the number its own ``clip_grad_norm_`` returns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype


def total_norm(tensors: Sequence[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """``torch.nn.utils.get_total_norm(tensors, norm_type)``, by hand before torch 2.6."""
    if hasattr(torch.nn.utils, "get_total_norm"):
        norm: torch.Tensor = torch.nn.utils.get_total_norm(list(tensors), norm_type)
        return norm
    return total_norm_by_hand(tensors, norm_type)


def total_norm_by_hand(tensors: Sequence[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """torch 2.4/2.5 ``clip_grad_norm_``'s total norm (finite ``norm_type``; no tensor: 0)."""
    if not tensors:
        return torch.tensor(0.0)
    first = tensors[0].device
    norms: list[torch.Tensor] = []
    for (_device, _dtype), ([group], _) in _group_tensors_by_device_and_dtype([list(tensors)]).items():
        norms.extend(torch._foreach_norm([t for t in group if t is not None], norm_type))
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), norm_type)
    return total


def clip_with_norm(params: Iterable[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """``torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)``, by hand before 2.6."""
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
        torch.nn.utils.clip_grads_with_norm_(list(params), max_norm, norm)
        return
    clip_with_norm_by_hand(params, max_norm, norm)


def clip_with_norm_by_hand(params: Iterable[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """torch 2.4/2.5 ``clip_grad_norm_``'s clipping, given the total norm."""
    grads = [p.grad for p in params if p.grad is not None]
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.device))
