"""Tensor parallelism (TP > 1) for the Megatron source: how tensors are sharded over ranks.

A megatron-core ``GPTModel`` with ``tensor_model_parallel_size = tp`` runs on ranks launched
under torchrun (``run/launch.py``, ``run/rank_main.py``). Each rank records its own trace, in
which sharded tensors are that rank's slice; ``gather_traces`` puts them back together in the
TP=1 layout (``run/launch_merge.py`` also renumbers pipeline stages), so the
gathered trace compares with a TP=1 Megatron run (same names) or, through the usual
mapping, with Hugging Face. How each tensor is sharded is data (``MEGATRON_GPT_RULES``),
so a wrong rule (``WRONG_FC1_RULES``) is a gather bug the comparison must catch.

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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..checkpoints.sharding import gather_tensor, rule_for_param, shard_tensor
from ..errors import CaseError
from ..parallel.rules import MEGATRON_GPT_RULES, Layout, ShardRule, rule_for
from ..trace.records import Record, Trace

if TYPE_CHECKING:
    import torch


def shard_state(
    full: Mapping[str, torch.Tensor],
    tp: int,
    rank: int,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
) -> dict[str, torch.Tensor]:
    """A TP=1 Megatron state (``named_parameters`` names) -> rank ``rank``'s shard of it."""
    if not 0 <= rank < tp:
        raise CaseError(f"rank {rank} is not in 0..{tp - 1}")
    out = {}
    for name, tensor in full.items():
        rule = rule_for_param(name, tuple(tensor.shape), rules)
        if rule is None:
            out[name] = tensor.detach().clone()
        else:
            out[name] = shard_tensor(tensor.detach(), rule.layout, rule.dim, tp, rank).clone()
    return out


# -- gathering traces --------------------------------------------------------------------------
def gather_traces(
    traces: Sequence[Trace],
    *,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
    strict: bool = False,
) -> Trace:
    """Per-rank traces of one run (tensor mode) -> one trace in the TP=1 layout.

    Records follow rank 0's execution order; replicated tensors are rank 0's. What cannot be
    gathered (a record missing on some rank, shapes that disagree, a tensor no rule shards
    whose shape differs across ranks) keeps rank 0's record and gets a note in
    ``manifest["tensor_parallel"]["notes"]`` (record id -> text). Replicas that are not
    bitwise equal across ranks are noted too, and raise ``CaseError`` with ``strict``.
    """
    if not traces:
        raise CaseError("gather_traces: no rank traces given")
    for rank, trace in enumerate(traces):
        if trace.mode != "tensor":
            raise CaseError(
                f"tensor parallel: rank {rank}'s trace was recorded in {trace.mode!r} mode; "
                "gathering shards needs record: {mode: tensor}"
            )
    gatherer = _Gatherer(traces, rules, strict)
    records = [gatherer.gather(rec) for rec in traces[0].records]
    return gatherer.trace(records)


class _Gatherer:
    """The state of one ``gather_traces``: notes, gathered tensors, replica checks."""

    def __init__(self, traces: Sequence[Trace], rules: Sequence[ShardRule], strict: bool) -> None:
        self.traces, self.rules, self.strict = traces, rules, strict
        self.by_id = [t.by_id() for t in traces]
        self.notes: dict[str, str] = {}
        self.tensors: dict[str, Any] = {}
        self.gathered: dict[tuple[tuple[str | None, ...], Layout, int], tuple[str, Any]] = {}
        self.replicas_checked = 0

    def keep(self, rec: Record, note: str | None = None) -> Record:
        if note:
            self.notes[rec.id] = note
        if rec.tensor_key is not None:
            self.tensors[rec.tensor_key] = self.traces[0].tensors[rec.tensor_key]
        return rec

    def gather(self, rec: Record) -> Record:
        others = [ids.get(rec.id) for ids in self.by_id]
        missing = [r for r, other in enumerate(others) if other is None]
        if missing:
            return self.keep(rec, f"only rank 0's slice: missing on rank(s) {missing}")
        peers: list[Record] = [o for o in others if o is not None]
        if rec.tensor_key is None or any(p.tensor_key is None for p in peers):
            return self.keep(rec)
        shards: list[torch.Tensor] = [
            t.tensors[p.tensor_key] for t, p in zip(self.traces, peers, strict=True) if p.tensor_key
        ]
        rule = rule_for(rec, self.rules)
        if rule is None or rule.layout == "replicated":
            return self.replicated(rec, shards, rule)
        return self.sharded(rec, peers, shards, rule)

    def replicated(self, rec: Record, shards: list[torch.Tensor], rule: ShardRule | None) -> Record:
        shapes = [tuple(s.shape) for s in shards]
        if any(s != shapes[0] for s in shapes):
            why = "no sharding rule" if rule is None else f"rule {rule.name!r} says replicated"
            return self.keep(rec, f"{why}, but the shape differs across ranks {shapes}: rank 0's slice")
        self.replicas_checked += 1
        diffs = [_max_diff(shards[0], s) for s in shards[1:]]
        if any(d != 0.0 for d in diffs):
            text = f"replicated, but ranks differ (max |rank0 - rank r| = {max(diffs):.3e}): rank 0's kept"
            if self.strict:
                raise CaseError(f"tensor parallel: {rec.id}: {text}")
            self.notes[rec.id] = text
        return self.keep(rec)

    def sharded(
        self, rec: Record, peers: list[Record], shards: list[torch.Tensor], rule: ShardRule
    ) -> Record:
        from ..recording.tensor_summary import tensor_stats

        shapes = [tuple(s.shape) for s in shards]
        if any(s != shapes[0] for s in shapes) or not shards[0].dim():
            return self.keep(
                rec, f"rule {rule.name!r}: rank shapes {shapes} cannot be gathered: rank 0's slice"
            )
        cache_key = (tuple(p.tensor_key for p in peers), rule.layout, rule.dim)
        hit = self.gathered.get(cache_key)
        if hit is None:  # one tensor recorded under several names is gathered once
            full = gather_tensor(shards, rule.layout, rule.dim)
            hit = (f"g{len(self.gathered):07d}", full)
            self.gathered[cache_key] = hit
            self.tensors[hit[0]] = full
        key, full = hit
        return replace(rec, shape=tuple(full.shape), stats=tensor_stats(full), tensor_key=key)

    def trace(self, records: list[Record]) -> Trace:
        rank0_ids = {r.id for r in self.traces[0].records}
        for rank, trace in enumerate(self.traces[1:], 1):
            for rec in trace.records:
                if rec.id not in rank0_ids and rec.id not in self.notes:
                    self.notes[rec.id] = f"recorded on rank {rank} but not on rank 0: dropped"
        manifest = dict(self.traces[0].manifest)
        manifest.pop("tp_rank", None)
        manifest["tensor_parallel"] = {
            "size": len(self.traces),
            "rules": [
                f"{r.name} [{r.role} {r.slot}] {r.layout} dim {r.dim}"
                for r in self.rules
                if r.layout != "replicated"
            ],
            "replicas_checked": self.replicas_checked,
            "notes": self.notes,
        }
        return Trace(manifest=manifest, records=tuple(records), tensors=self.tensors)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    import torch

    if torch.equal(a, b):
        return 0.0
    if not (a.is_floating_point() or a.is_complex()):
        return float((a.double() - b.double()).abs().max())
    diff = (a.double() - b.double()).abs()
    return float(torch.nan_to_num(diff, nan=float("inf")).max())
