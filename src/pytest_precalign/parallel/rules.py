"""How Megatron shards each recorded tensor over tensor-parallel ranks, as data (no torch).

``MEGATRON_GPT_RULES`` describes the local-spec GPTModel (see ``tensor_parallel`` for the
layout of each layer). ``rules_for_layout`` adds what a layout needs beyond it:

* msprobe dumps record a module's parameters as its inputs (slot ``param.weight``): every
  parameter rule gets an input-slot twin;
* with ``sequence_parallel`` the activations Megatron keeps replicated under plain TP (norms,
  dropouts, the reduce-scattered RowParallel outputs, the embedding output, the layers'
  hidden states) are split on the sequence dim (dim 0, Megatron is ``[s, b, h]``).

The first matching rule wins; a record no rule matches is replicated.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..trace.records import Record

Layout = Literal["replicated", "chunk", "gated"]
Role = Literal["param", "out", "in"]
# Which record kinds a rule's role covers: a tensor and the grads that belong to it.
ROLE_KINDS: Mapping[str, tuple[str, ...]] = {
    "param": ("param", "param_grad"),
    "out": ("activation", "grad_output"),
    "in": ("input", "grad_input"),
}


@dataclass(frozen=True)
class ShardRule:
    """How records named ``name`` (a glob) with a slot matching ``slot`` are split over
    TP ranks. ``role``: ``param`` (weights, their grads, their values after steps), ``out``
    (module outputs and their grads) or ``in`` (module inputs and their grads)."""

    name: str
    role: Role
    layout: Layout
    dim: int = 0
    slot: str = "*"
    why: str = ""

    def matches(self, record: Record) -> bool:
        return (
            record.kind in ROLE_KINDS[self.role]
            and fnmatch.fnmatchcase(record.name, self.name)
            and fnmatch.fnmatchcase(record.slot, self.slot)
        )

    def describe(self) -> str:
        return f"{self.name} [{self.role} {self.slot}] {self.layout} dim {self.dim}"


_ATTN = "*.self_attention"
MEGATRON_GPT_RULES: tuple[ShardRule, ...] = (
    # Weights.
    ShardRule("*.linear_qkv.*", "param", "chunk", 0, why="column parallel; whole KV groups per rank"),
    ShardRule("*.linear_fc1.weight", "param", "gated", 0, why="column parallel; [gate_r; up_r] per rank"),
    ShardRule("*.linear_fc1.bias", "param", "gated", 0, why="column parallel; [gate_r; up_r] per rank"),
    ShardRule("*.linear_proj.weight", "param", "chunk", 1, why="row parallel: input features"),
    ShardRule("*.linear_fc2.weight", "param", "chunk", 1, why="row parallel: input features"),
    ShardRule("*embedding.word_embeddings.weight", "param", "chunk", 0, why="vocab parallel"),
    ShardRule("*output_layer.weight", "param", "chunk", 0, why="column parallel over the vocabulary"),
    # Column-parallel outputs (not gathered: gather_output=False inside the layers).
    ShardRule("*.linear_qkv", "out", "chunk", -1, slot="out.0", why="whole KV groups per rank"),
    ShardRule("*.linear_fc1", "out", "gated", -1, slot="out.0", why="[gate_r; up_r] per rank"),
    # Row-parallel inputs; their outputs are all-reduced (replicated).
    ShardRule("*.linear_proj", "in", "chunk", -1, slot="in.0", why="this rank's heads' context"),
    ShardRule("*.linear_fc2", "in", "chunk", -1, slot="in.0", why="this rank's ffn features"),
    # Attention internals: this rank's heads. q/k/v are [s, b, heads, d]; scores [b, heads, s, s].
    ShardRule(f"{_ATTN}.q_layernorm", "in", "chunk", 2, slot="in.0", why="heads"),
    ShardRule(f"{_ATTN}.q_layernorm", "out", "chunk", 2, why="heads"),
    ShardRule(f"{_ATTN}.k_layernorm", "in", "chunk", 2, slot="in.0", why="KV groups"),
    ShardRule(f"{_ATTN}.k_layernorm", "out", "chunk", 2, why="KV groups"),
    ShardRule(f"{_ATTN}.core_attention", "in", "chunk", 2, slot="in.[012]", why="q, k, v heads"),
    ShardRule(f"{_ATTN}.core_attention", "out", "chunk", -1, why="context [s, b, heads * d]"),
    ShardRule(f"{_ATTN}.core_attention.*", "in", "chunk", 1, slot="in.0", why="scores [b, heads, s, s]"),
    ShardRule(f"{_ATTN}.core_attention.*", "out", "chunk", 1, why="probabilities [b, heads, s, s]"),
)

# Replicated under plain TP, split on the sequence dim under sequence parallelism: the
# embedding output, norms and dropouts, the reduce-scattered RowParallel outputs, the inputs
# the ColumnParallel layers all-gather, and each layer's hidden states (``layers.<n>``).
_SP = "sequence parallel: [s/tp, b, h] per rank"
_LAYER = ("*decoder.layers.?", "*decoder.layers.??", "*decoder.layers.???")
SEQUENCE_PARALLEL_RULES: tuple[ShardRule, ...] = (
    *(
        ShardRule(name, role, "chunk", 0, why=_SP)
        for name in ("*embedding.embedding_dropout", "*.input_layernorm", "*.pre_mlp_layernorm")
        + ("*.final_layernorm", "*decoder", *_LAYER)
        for role in ("in", "out")
    ),
    ShardRule("*embedding", "out", "chunk", 0, why=_SP),
    *(
        ShardRule(name, "out", "chunk", 0, slot="out.0", why=_SP)
        for name in ("*.self_attention.linear_proj", "*.mlp.linear_fc2", "*.self_attention", "*.mlp")
    ),
    *(
        ShardRule(name, "in", "chunk", 0, slot="in.0", why=_SP)
        for name in ("*.linear_qkv", "*.linear_fc1", "*output_layer")
    ),
)


def _param_slot_rules(rules: Iterable[ShardRule]) -> tuple[ShardRule, ...]:
    """msprobe records ``X.weight`` as input slot ``param.weight`` of module ``X``."""
    out = []
    for r in rules:
        if r.role == "param" and "." in r.name:
            owner, _, param = r.name.rpartition(".")
            out.append(replace(r, name=owner, role="in", slot=f"param.{param}"))
    return tuple(out)


# GPTModel(parallel_output=True): the logits stay split over the vocabulary on the TP ranks.
PARALLEL_OUTPUT_RULES: tuple[ShardRule, ...] = (
    ShardRule(
        "*output_layer", "out", "chunk", -1, slot="out.0", why="vocab-parallel logits (parallel_output)"
    ),
)


def rules_for_layout(
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
    *,
    sequence_parallel: bool = False,
    parallel_output: bool = False,
) -> tuple[ShardRule, ...]:
    """``rules`` with the msprobe parameter-slot twins, the vocab-parallel logits rule first
    when ``parallel_output``, and the sequence-parallel rules last when ``sequence_parallel``
    (the TP rules, e.g. column-parallel outputs, win)."""
    first = PARALLEL_OUTPUT_RULES if parallel_output else ()
    extra = SEQUENCE_PARALLEL_RULES if sequence_parallel else ()
    return (*first, *rules, *_param_slot_rules(rules), *extra)


def rule_for(record: Record, rules: Sequence[ShardRule] = MEGATRON_GPT_RULES) -> ShardRule | None:
    return next((r for r in rules if r.matches(record)), None)
