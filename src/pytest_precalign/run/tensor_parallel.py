"""Tensor parallelism (TP > 1) for the Megatron source: each rank's shard of the TP=1 weights.

A megatron-core ``GPTModel`` with ``tensor_model_parallel_size = tp`` runs on ranks launched
under torchrun (``run/launch.py``, ``run/rank_main.py``), each loading its ``rank_shard`` of every
synced TP=1 weight. Each rank records its own trace, in which sharded tensors are that rank's
slice; the one merge of rank folders (``parallel/merge.py``) puts them back together in the
TP=1 layout, so the merged trace compares with a TP=1 Megatron run (same names) or, through
the usual mapping, with Hugging Face. How each tensor is sharded is data
(``MEGATRON_GPT_RULES``), so a wrong rule (the tests' ``WRONG_FC1_RULES``) is a merge bug the
comparison must catch.

Sharding of the local-spec GPTModel (Megatron's ColumnParallelLinear shards the output
features, RowParallelLinear the input features and all-reduces its output):

* ``linear_qkv``: weight/bias rows and the output's last dim are plain chunks. The fused
  layout is grouped per KV group ``[q_g, k_g, v_g]`` and each rank holds whole groups, so
  concatenating the ranks in order gives the TP=1 layout.
* ``linear_fc1`` (SwiGLU): each rank holds ``[gate_r; up_r]``; TP=1 is ``[gate; up]``, so
  gathering takes every rank's gate half, then every rank's up half ("gated").
* ``linear_proj``/``linear_fc2``: weight on dim 1, their inputs on the last dim.
* Word embeddings and the output layer: weight rows (vocabulary) on dim 0.
* Attention internals (q/k layernorm, core attention, softmax, dropout): the head dim.
* Everything else is replicated: norms, the all-reduced RowParallel outputs, the embedding
  output (all-reduced), the logits (``parallel_output=False`` gathers them).

Grads (``grad_output``, ``grad_input``, ``param_grad``) and parameters after optimizer steps
shard like the tensors they belong to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..checkpoints.sharding import rule_for_param, shard_tensor
from ..errors import CaseError
from ..parallel.rules import MEGATRON_GPT_RULES, ShardRule

if TYPE_CHECKING:
    import torch


def rank_shard(
    name: str, tensor: torch.Tensor, tp: int, rank: int, rules: Sequence[ShardRule] = MEGATRON_GPT_RULES
) -> torch.Tensor:
    """Rank ``rank``'s slice of the TP=1 parameter ``name`` (the tensor itself when replicated)."""
    rule = rule_for_param(name, tuple(tensor.shape), rules)
    return tensor if rule is None else shard_tensor(tensor, rule.layout, rule.dim, tp, rank)


def shard_state(
    full: Mapping[str, torch.Tensor],
    tp: int,
    rank: int,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
) -> dict[str, torch.Tensor]:
    """A TP=1 Megatron state (``named_parameters`` names) -> rank ``rank``'s shard of it."""
    if not 0 <= rank < tp:
        raise CaseError(f"rank {rank} is not in 0..{tp - 1}")
    return {name: rank_shard(name, tensor.detach(), tp, rank, rules).clone() for name, tensor in full.items()}
