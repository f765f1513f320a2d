"""Global norms and zero counts of sharded tensors (``DTensor`` parameters and grads: FSDP2,
DTensor tensor parallelism), for ``StepEvidence``.

The norm of one rank's shard is not the global norm (a real class of bugs: a grad norm clipped
on local shards only). Here the tensors are split by the process groups that shard them
(``recording.sharded.local_part``; a plain tensor or a replicated DTensor: none, its local
tensor is the full one); each part's sum of squares and zero count is read from the local
tensors as an unsharded run reads its tensors (``step_norms``: the C kernels where built), then
summed over the part's groups (one all-reduce of two numbers per group), and the square root
taken of the total. Where every grad is a DTensor of one mesh, the grad norm is torch's own
(``get_total_norm(...).full_tensor()``): the number FSDP2's ``clip_grad_norm_`` returns, bit for
bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..recording.sharded import all_reduce_sum, is_dtensor, local_part

Part = tuple[tuple[Any, ...], list[int], list[torch.Tensor]]  # (groups, indices, local tensors)


def split(tensors: Sequence[torch.Tensor]) -> list[Part] | None:
    """The tensors' local parts by the groups that shard them, in first-seen order (the same on
    every rank); None when none is a DTensor (then nothing here is needed)."""
    if not any(is_dtensor(t) for t in tensors):
        return None
    parts: dict[tuple[Any, ...], Part] = {}
    for i, t in enumerate(tensors):
        local, groups = local_part(t) if is_dtensor(t) else (t, ())
        part = parts.setdefault(groups, (groups, [], []))
        part[1].append(i)
        part[2].append(local.detach())
    return list(parts.values())


def summed(values: list[float], groups: tuple[Any, ...], device: torch.device) -> list[float]:
    """``values`` added over the ranks of ``groups`` (float64)."""
    if not groups:
        return values
    reduced: list[float] = all_reduce_sum(
        torch.tensor(values, dtype=torch.float64, device=device), groups
    ).tolist()
    return reduced


def grad_norm_and_zeros(
    grads: Sequence[torch.Tensor], parts: list[Part], norm: float | None = None
) -> tuple[float, int]:
    """(global L2 norm, global count of exact zeros) of sharded ``grads``; ``norm``: the norm
    the caller has (the framework's), returned as it is and not computed again."""
    from .step_norms import grad_norm_and_zeros as local_norm_and_zeros

    squares, zeros = [], 0
    for groups, _, local in parts:
        count_norm, count = local_norm_and_zeros(local)
        total_sq, total_zeros = summed([count_norm * count_norm, float(count)], groups, local[0].device)
        squares.append(total_sq)
        zeros += int(total_zeros)
    if norm is not None:
        return norm, zeros
    if one_mesh(grads):
        return torch_norm(grads), zeros
    return math.sqrt(math.fsum(squares)), zeros


def one_mesh(grads: Sequence[torch.Tensor]) -> bool:
    """Whether every grad is a DTensor of one mesh: then the global norm is torch's
    (``torch_norm``), which refuses DTensors of several meshes (FSDP2 x TP)."""
    first = grads[0] if grads else None
    return (
        first is not None
        and all(is_dtensor(g) for g in grads)
        and all(g.device_mesh == first.device_mesh for g in grads)  # type: ignore[attr-defined]
    )


def torch_norm(grads: Sequence[torch.Tensor]) -> float:
    """torch's global norm of DTensor ``grads``: ``clip_grad_norm_``'s number."""
    norm: Any = torch.nn.utils.get_total_norm([g.detach() for g in grads], 2.0)
    if is_dtensor(norm):
        norm = norm.full_tensor()
    return float(norm)


def global_norms(
    local_squares: list[tuple[tuple[Any, ...], float, float]], device: torch.device
) -> tuple[float, float]:
    """sqrt of the sums over every part of its (squares a, squares b), each summed over the
    part's groups: the parameter and update norms of sharded parameters."""
    a, b = [], []
    for groups, sq_a, sq_b in local_squares:
        total_a, total_b = summed([sq_a, sq_b], groups, device)
        a.append(total_a)
        b.append(total_b)
    return math.sqrt(math.fsum(a)), math.sqrt(math.fsum(b))
