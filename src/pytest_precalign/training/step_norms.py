"""The parameter norm and the update norm of an optimizer step, each parameter and its
snapshot read once while hot in cache; the grads' norm and zero count, each grad read once.

``torch.nn.utils.get_total_norm`` over the parameters, then ``_foreach_sub_`` of the snapshot,
then ``get_total_norm`` over the snapshot: three sweeps over the whole model, each reading
every parameter (or snapshot) from memory again. On the CPU this does the same three
operations parameter by parameter (its norm, the subtraction in place in its snapshot, the
snapshot's norm), so a parameter that fits in cache is read from memory once and its snapshot
once. The values are bit for bit ``get_total_norm``'s: the per-tensor norms are the ones
torch's CPU ``_foreach_norm`` takes (one ``vector_norm`` per tensor), grouped by device and
dtype as it groups them, and reduced by the same ``vector_norm`` of their stack
(``tests/training/test_step_evidence_cost.py``). On a device, the fused foreach kernels are
kept (one launch per sweep, already one read each)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from ..recording.host_sync import to_host


def param_and_update_norms(
    params: Sequence[torch.Tensor], before: Sequence[torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(total L2 norm of ``params``, total L2 norm of ``before - params``), as 0-d tensors;
    ``before`` (the snapshot, same shapes) is overwritten with ``before - params``. Without a
    snapshot, the parameter norm only."""
    if before is None:
        return torch.nn.utils.get_total_norm(params, 2.0), None
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


def grad_norm_and_zeros(grads: Sequence[torch.Tensor]) -> tuple[float, int]:
    """(global L2 norm, count of exact zeros) of ``grads`` in one host sync, each grad read
    once on the CPU (its norm, then its nonzero count while it is in cache): bit for bit
    ``step_evidence.grad_norm`` and ``zero_count``, which read every grad twice and sync
    twice. (0.0, 0) for no grads."""
    if not grads:
        return 0.0, 0
    groups = _group_tensors_by_device_and_dtype([[g.detach() for g in grads]])
    norms: list[torch.Tensor] = []
    nonzero: list[torch.Tensor] = []
    for (device, _), ([maybe], _) in groups.items():
        tensors = [t for t in maybe if t is not None]
        if device.type == "cpu":
            for g in tensors:
                norms.append(torch.linalg.vector_norm(g, 2.0))
                nonzero.append(torch.count_nonzero(g))
        else:
            norms.extend(torch._foreach_norm(tensors, 2.0))
            nonzero.extend(torch.count_nonzero(g) for g in tensors)
    first = grads[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), 2.0)
    count = torch.stack([c.to(first) for c in nonzero]).sum()
    norm, nonzeros = to_host(torch.stack([total.to(torch.float64), count.to(torch.float64)]))
    return norm, sum(g.numel() for g in grads) - int(nonzeros)
