"""How the local-spec GPTModel's parameters are split over tensor-parallel ranks, as tensor
operations: rank ``r``'s slice of a TP=1 tensor and the TP=1 tensor from every rank's slice.

Which parameter is column / row parallel is not in a state dict (megatron-core keeps it in
the parameters' ``tensor_model_parallel`` / ``partition_dim`` attributes), so it comes from
the names, as data: ``parallel.rules.MEGATRON_GPT_RULES`` (sharded) and ``REPLICATED_PARAMS``
(the same on every TP rank). A name in neither is not guessed (``param_layout``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import CaseError
from ..parallel.rules import MEGATRON_GPT_RULES, Layout, ShardRule, rule_for
from ..trace.records import Record

if TYPE_CHECKING:
    import torch

# Replicated over the TP ranks in the GPT local spec: norms (also q/k norms and the fused
# ``layer_norm_*`` names of the TE spec) and the biases of the row-parallel layers (added
# after the all-reduce).
REPLICATED_PARAMS: tuple[str, ...] = (
    "*layernorm.weight",
    "*layernorm.bias",
    "*.layer_norm_weight",
    "*.layer_norm_bias",
    "*.linear_proj.bias",
    "*.linear_fc2.bias",
    "*position_embeddings.weight",
)


def _param_record(name: str, shape: tuple[int, ...]) -> Record:
    return Record(0, name, "", "step", 0, 0, "param", "", "", shape)


def rule_for_param(
    name: str, shape: tuple[int, ...], rules: Sequence[ShardRule] = MEGATRON_GPT_RULES
) -> ShardRule | None:
    """How the TP=1 parameter ``name`` is split over the tensor-parallel ranks (None: replicated)."""
    return rule_for(_param_record(name, shape), rules)


def param_layout(name: str, shape: tuple[int, ...]) -> ShardRule | None | str:
    """A checkpoint parameter's TP layout: its rule, None (known replicated) or, for a name
    neither list knows, the message saying so."""
    if any(fnmatch.fnmatchcase(name, p) for p in REPLICATED_PARAMS):
        return None
    rule = rule_for_param(name, shape)
    if rule is not None:
        return rule
    known = [r.name for r in MEGATRON_GPT_RULES if r.role == "param"] + list(REPLICATED_PARAMS)
    return (
        f"{name}: not a known parameter of the GPT local spec, so how it is split over the "
        f"tensor-parallel ranks is unknown (known names: {', '.join(known)})"
    )


# -- the layout operations -------------------------------------------------------------------
def shard_tensor(full: torch.Tensor, layout: Layout, dim: int, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s slice of a TP=1 tensor."""
    if layout == "replicated":
        return full
    if full.shape[dim] % (tp * (2 if layout == "gated" else 1)):
        raise CaseError(f"cannot shard a tensor of shape {list(full.shape)} on dim {dim} over {tp} ranks")
    if layout == "chunk":
        return full.chunk(tp, dim)[rank]
    gate, up = full.chunk(2, dim)
    return _cat([gate.chunk(tp, dim)[rank], up.chunk(tp, dim)[rank]], dim)


def gather_tensor(shards: Sequence[torch.Tensor], layout: Layout, dim: int) -> torch.Tensor:
    """The TP=1 tensor from every rank's slice, in rank order (``gated``: each rank holds
    ``[gate_r; up_r]``, the result is ``[gate; up]``)."""
    if layout == "replicated":
        return shards[0]
    if layout == "chunk":
        return _cat(list(shards), dim)
    halves = [s.chunk(2, dim) for s in shards]
    return _cat([h[0] for h in halves] + [h[1] for h in halves], dim)


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    import torch

    return torch.cat(parts, dim).contiguous()
