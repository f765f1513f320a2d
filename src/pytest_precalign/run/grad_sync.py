"""The launched ranks' grad reduction: megatron-core's own ``finalize_model_grads``.

Megatron's training loop sets ``config.finalize_model_grads_func = finalize_model_grads``;
its pipeline schedule calls it at the end of the backward, before the optimizer step. It
all-reduces over the tensor-parallel group the grads of parameters each rank holds whole but
computes only in part: ``q_layernorm``/``k_layernorm`` weights (each rank normalises its own
heads with the same weight, so its grad is a partial sum), sequence-parallel layernorms and
those marked ``average_gradients_across_tp_domain``; across pipeline stages the shared word
embedding; across data-parallel replicas everything. Without it a rank's optimizer steps on
partial grads, and a recorded grad is not the one the optimizer sees.

``finalize_model_grads`` expects Megatron's ``DistributedDataParallel`` chunks (it reads
``ddp_config`` and calls ``finish_grad_sync``). The ranks train the bare model with a torch
optimizer on ``param.grad``, without data parallelism (expert-parallel replicas aside), so each chunk is handed over in
``_BareChunk``: the default ``DistributedDataParallelConfig`` and no data-parallel sync (there
is one replica). Megatron's functions find the model's config and parameters through
``.module`` as they do through DDP.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import CaseError


class _BareChunk:
    """A bare model chunk as ``finalize_model_grads`` expects a DDP-wrapped one."""

    def __init__(self, module: Any, ddp_config: Any) -> None:
        self.module = module
        self.ddp_config = ddp_config

    def finish_grad_sync(self, force_all_reduce: bool = False) -> None:
        """One data-parallel replica: nothing to reduce."""


def use_megatron_grad_finalization(module: torch.nn.Module) -> None:
    """Make megatron-core's pipeline schedule call ``finalize_model_grads`` after the backward,
    as Megatron's training loop does (on ``module``'s config)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads

    # Expert-parallel ranks are data-parallel replicas of everything but their experts; they
    # run the same batch and only the first back-propagates (rank_main), so there is nothing to
    # reduce across them either. Any other replica would be real data parallelism.
    dp = ps.get_data_parallel_world_size()
    if dp != 1 and dp != ps.get_expert_model_parallel_world_size():
        raise CaseError(f"launched ranks train without data parallelism; data-parallel size is {dp}")
    ddp_config = DistributedDataParallelConfig()

    def finalize(model: Sequence[torch.nn.Module], num_tokens: Any = None, **kwargs: Any) -> None:
        finalize_model_grads([_BareChunk(m, ddp_config) for m in model], num_tokens, **kwargs)

    config: Any = module.config
    config.finalize_model_grads_func = finalize
