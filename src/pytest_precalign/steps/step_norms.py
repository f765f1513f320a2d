"""The parameter norm and the update norm of an optimizer step, each parameter and its
snapshot read once (and, where the C kernels run, the next step's snapshot written in the same
read); the grads' norm and zero count, each grad read once.

On the CPU, where the C kernels are built (``recording/native_kernels.py``), one pass over
each parameter and its snapshot gives both sums of squares (``before - after`` is never
written), added exactly (``math.fsum``) over the parameters: the norms in float64, within
``SUM_ULPS`` epsilon of the exact values, the same on every x86-64 CPU and thread count; and
each grad's zeros are counted by one pass of their bits (exact: ``count_nonzero``'s count,
2.7x faster: ``python benchmarks/stats_one_read.py``). The grad norm stays torch's (``get_total_norm``: the number ``clip_grad_norm_``
returns, so a framework's reported norm and ours agree bit for bit).

Elsewhere (a device; no C compiler; ``PRECALIGN_FUSED_STATS=0``): ``get_total_norm`` over the
parameters, the subtraction in place in the snapshot, ``get_total_norm`` over it -- on the CPU
parameter by parameter so that each is read from memory once, on a device the fused foreach
kernels (one launch per sweep) -- bit for bit ``get_total_norm``'s values
(``tests/training/test_step_evidence_cost.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from ..recording import native_kernels
from ..recording.host_sync import to_host
from .torch_norms import total_norm


def param_and_update_norms(
    params: Sequence[torch.Tensor], before: Sequence[torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(total L2 norm of ``params``, total L2 norm of ``before - params``), as 0-d tensors;
    ``before`` (the snapshot, same shapes) is overwritten with ``before - params`` unless the
    C kernels measure it in place. Without a snapshot, the parameter norm only."""
    native = _native_norms(params, before)
    if native is not None:
        return native
    if before is None:
        return total_norm(params, 2.0), None
    groups = _group_tensors_by_device_and_dtype([list(params), list(before)])
    param_norms: list[torch.Tensor] = []
    update_norms: list[torch.Tensor] = []
    for (device, _), ([maybe_after, maybe_snapshot], _) in groups.items():
        after = [t for t in maybe_after if t is not None]  # torch types the lists as optional
        snapshot = [t for t in maybe_snapshot if t is not None]
        if device.type == "cpu":
            for p, b in zip(after, snapshot, strict=True):
                param_norms.append(torch.linalg.vector_norm(p, 2.0))
                b.sub_(p)
                update_norms.append(torch.linalg.vector_norm(b, 2.0))
        else:
            param_norms.extend(torch._foreach_norm(after, 2.0))
            torch._foreach_sub_(snapshot, after)
            update_norms.extend(torch._foreach_norm(snapshot, 2.0))
    first = params[0].device
    return (
        torch.linalg.vector_norm(torch.stack([n.to(first) for n in param_norms]), 2.0),
        torch.linalg.vector_norm(torch.stack([n.to(first) for n in update_norms]), 2.0),
    )


def norms_keeping_snapshot(
    params: Sequence[torch.Tensor], before: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``param_and_update_norms(params, before)`` from the C kernels, which also copy each
    parameter into its snapshot buffer block by block as they read it: ``before`` then holds
    the parameters as they are now, the next step's snapshot, without the copy's own read of
    every parameter (``StepEvidence.begin``). None, nothing written, where the kernels cannot
    (a dtype without one, a device, a non-contiguous parameter, ``PRECALIGN_FUSED_STATS=0``)."""
    if not all(p.is_contiguous() and b.is_contiguous() for p, b in zip(params, before, strict=True)):
        return None
    norms = _native_norms(params, before, keep=True)
    if norms is None:
        return None
    param, update = norms
    assert update is not None
    return param, update


def _native_norms(
    params: Sequence[torch.Tensor], before: Sequence[torch.Tensor] | None, *, keep: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The two norms from the C kernels, as float64 0-d tensors; None unless every parameter
    has one (one definition for the whole model)."""
    pairs = [(p, p if before is None else before[i]) for i, p in enumerate(params)]
    squares = native_kernels.norms_of(pairs, keep=keep and before is not None)
    if squares is None:
        return None
    param = math.sqrt(math.fsum(s for s, _ in squares))
    update = math.sqrt(math.fsum(u for _, u in squares))
    return torch.tensor(param, dtype=torch.float64), (
        None if before is None else torch.tensor(update, dtype=torch.float64)
    )


def grad_norm_and_zeros(grads: Sequence[torch.Tensor]) -> tuple[float, int]:
    """(global L2 norm, count of exact zeros) of ``grads`` in one host sync, each grad read
    once on the CPU (its norm, then its zeros -- from their bits by the C kernels where they
    are built, else ``count_nonzero`` -- while it is in cache): bit for bit
    ``step_evidence.grad_norm`` and ``zero_count``, which read every grad twice and sync
    twice. (0.0, 0) for no grads."""
    if not grads:
        return 0.0, 0
    groups = _group_tensors_by_device_and_dtype([[g.detach() for g in grads]])
    norms: list[torch.Tensor] = []
    nonzero: list[torch.Tensor] = []
    zeros = 0  # counted on the host by the C kernels
    counted_by_torch = 0  # elements of the grads whose nonzeros torch counts
    for (device, _), ([maybe], _) in groups.items():
        tensors = [t for t in maybe if t is not None]
        if device.type == "cpu":
            for g in tensors:
                norms.append(torch.linalg.vector_norm(g, 2.0))
                counted = native_kernels.zeros(g)
                if counted is None:
                    nonzero.append(torch.count_nonzero(g))
                    counted_by_torch += g.numel()
                else:
                    zeros += counted
        else:
            norms.extend(torch._foreach_norm(tensors, 2.0))
            nonzero.extend(torch.count_nonzero(g) for g in tensors)
            counted_by_torch += sum(g.numel() for g in tensors)
    first = grads[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), 2.0)
    count = torch.stack([c.to(first) for c in nonzero]).sum() if nonzero else torch.zeros((), device=first)
    norm, nonzeros = to_host(torch.stack([total.to(torch.float64), count.to(torch.float64)]))
    return norm, zeros + counted_by_torch - int(nonzeros)
