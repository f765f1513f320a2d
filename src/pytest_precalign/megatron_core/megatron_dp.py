"""Data parallelism with megatron-core's distributed optimizer, as the launched ``megatron``
trainer runs it: each DP replica trains on its share of every step's micro-batches, and the
grads it records are the whole reduced grads (``reduced_main_grads``).

With ``use_distributed_optimizer`` megatron-core's DDP reduce-scatters each grad bucket over
the DP group: after ``finalize_model_grads`` a rank's ``main_grad`` buffer holds the reduced
(averaged) grads only in its own shard of each bucket, the rest being its local grads; the
optimizer steps on the shard and all-gathers the updated parameters. To record what the
optimizer as a whole steps on, ``reduced_main_grads`` all-gathers the ranks' shards into a copy
and points each parameter's ``main_grad`` at it for the block: nothing of the training changes
(the buffers are only read; every ``main_grad`` is restored after).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def data_parallel_rank() -> tuple[int, int]:
    """(replicas, this rank's replica) of megatron-core's data parallelism; (1, 0) without it.
    Expert-parallel ranks sit inside megatron-core's data-parallel group and run the same
    batch: they are one replica."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1, 0
    ep = int(ps.get_expert_model_parallel_world_size())
    return int(ps.get_data_parallel_world_size()) // ep, int(ps.get_data_parallel_rank()) // ep


def replica_share(items: Sequence[T], size: int, rank: int) -> list[T]:
    """Replica ``rank``'s contiguous share of a step's micro-batches (megatron-core's split of
    the global batch over the DP ranks); ``size`` must divide them."""
    if len(items) % size:
        raise ValueError(f"{len(items)} micro-batches cannot be split over {size} data-parallel replicas")
    share = len(items) // size
    return list(items[rank * share : (rank + 1) * share])


@contextlib.contextmanager
def reduced_main_grads(chunks: Sequence[Any]) -> Iterator[None]:
    """For the block, every parameter's ``main_grad`` of the DDP ``chunks`` is the whole
    reduced grad (the DP ranks' reduce-scattered shards all-gathered into a copy); a no-op
    without the distributed optimizer or data parallelism."""
    import torch.distributed as dist

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps

    distributed = any(getattr(c.ddp_config, "use_distributed_optimizer", False) for c in chunks)
    if not distributed or not ps.model_parallel_is_initialized() or ps.get_data_parallel_world_size() == 1:
        yield
        return
    group = ps.get_data_parallel_group()  # the group megatron-core reduce-scatters over
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    saved: list[tuple[Any, torch.Tensor]] = []  # (megatron's parameter, its main_grad)
    for chunk in chunks:
        for buffer in list(chunk.buffers) + list(chunk.expert_parallel_buffers):
            full = torch.empty_like(buffer.grad_data)
            for bucket in buffer.buckets:
                numel = bucket.grad_data.numel()
                shard = numel // size
                local = bucket.grad_data[rank * shard : (rank + 1) * shard].contiguous()
                dist.all_gather_into_tensor(full[bucket.offset : bucket.offset + numel], local, group=group)
            for param, (start, end, _) in buffer.param_index_map.items():
                saved.append((param, param.main_grad))
                param.main_grad = full[start:end].view(param.shape)
    try:
        yield
    finally:
        for param, grad in saved:
            param.main_grad = grad


@contextlib.contextmanager
def replica_grad_scale(chunks: Sequence[torch.nn.Module], size: int) -> Iterator[None]:
    """For the block, each parameter's grad is multiplied by ``size`` (the DP replicas) before
    megatron-core's DDP accumulates it into ``main_grad`` and averages it over the replicas: the
    update is that of the step's per-token loss, as if the replica's loss were ``size`` times
    its part of it, while each layer's activation grads stay those of the step's per-token
    loss, as in one process (a power-of-2 ``size`` changes no bit of the parameter grads)."""
    if size == 1:
        yield
        return
    handles = [
        param.register_hook(lambda grad: grad * size)
        for chunk in chunks
        for param in chunk.parameters()
        if param.requires_grad
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
