"""Tensor subclasses, told apart from the plain tensors the statistics read as raw memory.

A wrapper subclass (torch's ``DTensor``, torchao's float8 / NF4 tensors, quantised parameters)
holds no values of its own: its ``data_ptr()`` is 0 and ``.tolist()`` refuses it, so none may
reach the C kernels (``native_kernels``) or a host conversion. ``plain`` says which tensors may;
``whole`` gives the plain tensor a subclass stands for, or one ``RecorderError``.

A ``DTensor`` stands for the full (global) tensor its shards make up on its device mesh:

- ``Shard`` placements: each rank holds a piece; statistics of the pieces combine (max of the
  maxima, sums of the sums and of the squares) over the mesh dimensions that shard it
  (``shard_groups``; ``sharded_stats.py`` does it once per step for a recorder);
- ``Replicate``: each rank holds all of it, the local tensor is the full one on those dims;
- an ``AsyncCollectiveTensor`` (a tensor-parallel output whose collective is in flight) is the
  plain tensor it will be: waited for;
- ``Partial``: each rank holds a summand, so the full tensor is first reduced (a collective,
  ``redistribute`` to ``Replicate`` on those dims) -- rare where a recorder looks: outputs and
  grads reach the hooks reduced.

``whole`` gathers (``full_tensor()``, a collective over the mesh): what hash and tensor modes,
live compare and any one-off summary take, so that a sharded run's hashes and tensors are
those of the unsharded run. Every rank of the mesh must then read the same DTensors in the same
order, as SPMD training does.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, cast

import torch

from ..errors import RecorderError

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def plain(t: torch.Tensor) -> bool:
    """Whether ``t`` holds its own values in memory that raw-pointer code may read: a tensor or
    parameter, or a subclass that only overrides Python behaviour (no ``__torch_dispatch__``
    wrapper). False for a ``DTensor`` and every other wrapper subclass."""
    cls = type(t)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return True
    return not torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Python)


@functools.cache
def _dtensor_class() -> type | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch 2.4 (pyproject's lower bound): public from 2.5 on
        return cast(type, importlib.import_module("torch.distributed._tensor").DTensor)
    return DTensor


def is_dtensor(t: torch.Tensor) -> bool:
    cls = _dtensor_class()
    return cls is not None and isinstance(t, cls)


def refusal(t: torch.Tensor, rid: str) -> RecorderError:
    """The one error for a subclass whose values the tool cannot read."""
    cls = type(t)
    return RecorderError(
        f"recorder: {rid} is a {cls.__module__}.{cls.__qualname__} (a tensor subclass whose "
        "values the recorder cannot read): leave its module out of the recording (exclude=) or "
        "record another level"
    )


def _unpartial(t: Any) -> Any:
    """A DTensor with its ``Partial`` placements reduced (``Replicate`` there): a collective."""
    from torch.distributed.tensor import Replicate

    if not any(p.is_partial() for p in t.placements):
        return t
    placements = [Replicate() if p.is_partial() else p for p in t.placements]
    return t.redistribute(t.device_mesh, placements)


def whole(t: torch.Tensor, rid: str) -> torch.Tensor:
    """The plain tensor a subclass stands for: a DTensor's full tensor (gathered over its mesh),
    a Python-only subclass as a ``torch.Tensor`` of the same memory; any other wrapper subclass
    is one ``RecorderError`` naming the record ``rid``."""
    if plain(t):
        return t if type(t) in _PLAIN_TYPES else t.detach().as_subclass(torch.Tensor)
    if is_dtensor(t):
        with torch.no_grad():
            full: torch.Tensor = _unpartial(t.detach()).full_tensor()
        if plain(full):
            return full
    pending = _collective_result(t)
    if pending is not None:
        return pending
    raise refusal(t, rid)


def _collective_result(t: torch.Tensor) -> torch.Tensor | None:
    """The plain tensor of an ``AsyncCollectiveTensor`` (what a tensor-parallel module hands on
    before its collective has finished: ``RowwiseParallel``'s output): waited for, as the next
    operation on it would (only the moment of the wait moves); None for another subclass."""
    if type(t).__name__ != "AsyncCollectiveTensor" or not callable(getattr(t, "trigger_wait", None)):
        return None
    done = cast(torch.Tensor, t.trigger_wait())  # type: ignore[attr-defined]
    return done if plain(done) else None


def local_part(t: Any) -> tuple[torch.Tensor, tuple[Any, ...]]:
    """(the rank's local tensor, the process groups of the mesh dimensions that shard it) of a
    DTensor, its ``Partial`` placements reduced first; the full tensor is the local tensors of
    those groups' ranks put together."""
    if any(p.is_partial() for p in t.placements):
        with torch.no_grad():
            t = _unpartial(t.detach())
    mesh = t.device_mesh
    groups = tuple(mesh.get_group(dim) for dim, p in enumerate(t.placements) if _shards(p))
    # The local tensor as it is held, detached: no DTensor operation (``t.detach()`` and
    # ``to_local()`` each go through DTensor's dispatch, ~0.1 ms a call, run for every sharded
    # parameter and grad several times a recorded step).
    held = getattr(t, "_local_tensor", None)
    local: torch.Tensor = held if isinstance(held, torch.Tensor) else t.to_local()
    waited = None if plain(local) else _collective_result(local)  # a collective's pending result
    local = local if waited is None else waited  # (``SequenceParallel``'s input): waited for
    if not plain(local):  # a DTensor of a subclass (a float8 shard): not readable
        raise TypeError(type(local).__name__)
    return local.detach(), groups


def _shards(placement: Any) -> bool:
    """Whether a placement splits the tensor over its mesh dimension: ``Shard``, and the
    ``_StridedShard`` FSDP2 gives a tensor-parallel parameter on a 2-D mesh (torch 2.13: not
    ``is_shard()``; its pieces interleave, which sums and extremes do not see)."""
    return bool(placement.is_shard()) or type(placement).__name__ == "_StridedShard"


def all_reduce_sum(values: torch.Tensor, groups: tuple[Any, ...]) -> torch.Tensor:
    """``values`` summed over every rank of ``groups`` (one all-reduce per group, in place)."""
    for group in groups:
        torch.distributed.all_reduce(values, group=group)
    return values
