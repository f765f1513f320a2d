"""Data-parallel replicas that each trained their own rows of the global batch (DDP, FSDP,
ZeRO: every rank a replica of the model) -> the records of one process that trained the whole
global batch.

Whether the replicas saw different rows is read from what they recorded (``saw_different_data``):
their step's ``batch_hash`` scalars differ, or the inputs of the model's first module do.
Replicas that saw the same data are copies: they must agree record by record, and a replica
that does not is a finding naming its rank (``copies_differ``), never a crash.

Replicas that saw different rows are joined (``join_replicas``), record by record:

* a module's input, output and their grads: the replicas' tensors concatenated along the
  batch (dim 0; dim 1 of a Megatron run's tensors of 3 dims or more, ``[s, b, h]``:
  ``batch_dim``) in rank order (the global batch when each rank takes the next contiguous
  share of it); statistics merged as msprobe's ``parallel_merge`` merges shards (max of max,
  min of min, sums added); a tensor each replica holds identically with one row (a broadcast
  position embedding) is kept once. A rank's backward is of its own loss, one term of the
  global one: its grads are scaled by its share of the global loss (``weights``: its tokens
  over all tokens when every rank records ``tokens``, else 1 / replicas) -- exactly what the
  one-process run's backward of the global loss gives.
* a loss (one number per replica): their weighted mean, the global batch's loss.
* parameters (recorded after the optimizer step), and parameter grads recorded after the
  reduction (``param_grads="step"``): the same on every replica; checked equal, replica 0's
  kept, a replica that differs is a finding naming its rank.
* parameter grads recorded in the backward (``param_grads="backward"``, the default): with
  DDP each rank's partial grad before the reduction (FSDP2's hooks see the reduced shard: the
  same on every replica, so kept once as the reduced grad) -- partial ones are not joined: kept per replica (slot ``dp<d>``),
  paired only with another DP run's same replica (a rerun names the rank whose grads
  differ), listed as unpaired with the reason against a run split otherwise.
* what cannot be joined row by row -- hashes (the hash of a concatenation is not a function of
  the parts' hashes), replicas whose shapes differ beyond the batch (dynamic padding), a
  tensor of no batch dim that differs -- is listed as unpaired with the reason, never guessed.

Each joined record's replicas are kept in ``parts`` (record id -> each replica's lead rank
folder, rows and statistics, scaled as joined): where a joined record diverges, the verdict
checks each replica's rows against the other side's same rows and names the rank that differs
(``verdict.dp_rows``).

No torch import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..errors import TraceError
from ..trace.merged_stats import merge_stats
from ..trace.note_blocks import JoinedPart, ReplicaMismatch
from ..trace.records import Record, Stats, Trace
from .store import Plan

BACKWARD_KINDS = frozenset({"grad_output", "grad_input"})
PARTIAL_GRADS = (
    "a parameter grad recorded in the backward (param_grads='backward') is one DP rank's partial "
    "grad, before the reduction: record with Recorder(param_grads='step') to compare the reduced grads"
)


@dataclass(frozen=True)
class Replica:
    """One DP replica's records (its ranks merged), its lead rank folder and its plans."""

    where: str
    records: Sequence[Record]
    plans: Mapping[str, Plan]
    weight: float = 1.0  # its share of the global loss


@dataclass
class Joined:
    records: list[Record] = field(default_factory=list)
    plans: dict[str, Plan] = field(default_factory=dict)
    unpaired: dict[str, str] = field(default_factory=dict)  # record id -> why it was not joined
    mismatches: list[ReplicaMismatch] = field(default_factory=list)
    joined: int = 0  # records joined along the batch
    parts: dict[str, tuple[JoinedPart, ...]] = field(default_factory=dict)  # record id -> its replicas


def batch_dim(rec: Record, seq_first: bool, rows: int | None) -> int | None:
    """The dim of ``rec`` that holds the replica's ``rows``: dim 0, but in a Megatron run
    (``seq_first``: ``[s, b, h]`` hidden states beside ``[b, s]`` token ids, ``[b, s, h]``
    word embeddings and ``[b, heads, s, s]`` attention scores) dim 1 where it has the
    replica's row count, else dim 0 where that has it, else None (not joined)."""
    if not seq_first or rows is None or not rec.shape:
        return 0
    for dim in (1, 0):
        if len(rec.shape) > dim and rec.shape[dim] == rows:
            return dim
    return None


def model_rows(records: Sequence[Record]) -> int | None:
    """A replica's rows: dim 0 of its first module's first input (the token ids)."""
    head = records[0].name if records else None
    first = next((r for r in records if r.name == head and r.kind == "input" and r.shape), None)
    return first.shape[0] if first is not None else None


def _without(shape: Sequence[int], dim: int) -> tuple[int, ...]:
    return (*shape[:dim], *shape[dim + 1 :])


def same_record(a: Record, b: Record) -> bool:
    return a.shape == b.shape and same_stats(a.stats, b.stats) and a.crc32 == b.crc32


def same_stats(a: Stats | None, b: Stats | None) -> bool:
    if a is None or b is None:
        return a is b
    pairs = zip(a.as_dict().values(), b.as_dict().values(), strict=True)
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in pairs)


def show(rec: Record) -> str:
    if rec.stats is not None:
        s = rec.stats
        return f"max {s.max:.6g}, min {s.min:.6g}, mean {s.mean:.6g}, norm {s.norm:.6g}"
    if rec.crc32 is not None:
        return f"hash {rec.crc32}"
    return f"shape {list(rec.shape)}"


def saw_different_data(replicas: Sequence[Sequence[Record]], hashes: Sequence[str | None]) -> bool:
    """The replicas trained on different rows: their steps' batch hashes differ (every replica
    recorded one), or an input of the model's first recorded module differs."""
    if len(hashes) > 1 and all(h is not None for h in hashes) and len(set(hashes)) > 1:
        return True
    first = replicas[0]
    if not first:
        return False
    head = first[0].name
    inputs = {r.id: r for r in first if r.kind == "input" and r.name == head}
    return any(
        r.id in inputs and not same_record(inputs[r.id], r)
        for other in replicas[1:]
        for r in other
        if r.kind == "input"
    )


def mismatch(rec: Record, kept: str, differ: Sequence[tuple[str, Record]]) -> ReplicaMismatch:
    """A finding: replicas that should hold the same record disagree (the verdict fails on it)."""
    return ReplicaMismatch.of(rec, kept, [w for w, _ in differ], f"{show(differ[0][1])} vs {show(rec)}")


def _same_ids(replicas: Sequence[Replica], where: str) -> list[dict[str, Record]]:
    by_id = [{r.id: r for r in rep.records} for rep in replicas]
    for rep, ids in zip(replicas[1:], by_id[1:], strict=True):
        if set(ids) != set(by_id[0]):
            diff = sorted(set(ids) ^ set(by_id[0]))
            raise TraceError(
                f"{where}: DP replicas hold different records ({rep.where} vs {replicas[0].where}), "
                f"e.g. {diff[0]!r}; every replica must run the same modules as often"
            )
    return by_id


def copies_differ(replicas: Sequence[Replica], where: str) -> list[ReplicaMismatch]:
    """Replicas that saw the same data: every record the same on each; the differing ones as
    findings naming the replica (replica 0's records are kept)."""
    by_id = _same_ids(replicas, where)
    out = []
    for rec in replicas[0].records:
        differ = [(rep.where, ids[rec.id]) for rep, ids in zip(replicas[1:], by_id[1:], strict=True)]
        differ = [(w, r) for w, r in differ if not same_record(rec, r)]
        if differ:
            out.append(mismatch(rec, replicas[0].where, differ))
    return out


def join_replicas(
    replicas: Sequence[Replica],
    *,
    grads_reduced: bool,
    where: str,
    key_prefix: str = "",
    seq_first: bool = False,
) -> Joined:
    """The replicas' records as the one-process run's (module doc). ``grads_reduced``: the
    parameter grads were recorded after the reduction (``param_grads="step"``); ``seq_first``:
    a Megatron run's (``batch_dim``)."""
    by_id = _same_ids(replicas, where)
    out = Joined()
    rows = model_rows(replicas[0].records)
    for rec in replicas[0].records:
        peers = [ids[rec.id] for ids in by_id]
        reduced = rec.kind == "param_grad" and (grads_reduced or all(same_record(rec, p) for p in peers[1:]))
        if rec.kind == "param" or reduced:
            differ = [(rep.where, p) for rep, p in zip(replicas[1:], peers[1:], strict=True)]
            differ = [(w, p) for w, p in differ if not same_record(rec, p)]
            if differ:
                out.mismatches.append(mismatch(rec, replicas[0].where, differ))
            out.records.append(rec)
            continue
        if rec.kind == "param_grad":
            out.unpaired[rec.id] = PARTIAL_GRADS
            out.records += _per_replica(rec, peers, replicas, out, key_prefix)
            continue
        dim = batch_dim(rec, seq_first, rows)
        if dim is None:
            out.unpaired[rec.id] = (
                f"no dim of shape {list(rec.shape)} holds the DP replica's {rows} rows: it cannot be joined"
            )
            continue
        if all(same_record(rec, p) for p in peers[1:]) and (not rec.shape or rec.shape[dim] == 1):
            out.records.append(rec)  # the same on every replica and no batch to join: kept once
            continue
        joined = _joined(rec, peers, replicas, out, key_prefix, dim)
        if joined is not None:
            out.records.append(joined)
    out.records = [replace(r, seq=i) for i, r in enumerate(out.records)]
    return out


def _per_replica(
    rec: Record, peers: Sequence[Record], replicas: Sequence[Replica], out: Joined, key_prefix: str
) -> list[Record]:
    """A partial grad kept per replica, in slot ``dp<d>``: paired only with another DP run's
    replica ``d`` (a rerun, or a run split the same way), where a rank that differs is named."""
    kept = []
    for d, (rep, p) in enumerate(zip(replicas, peers, strict=True)):
        plan = rep.plans.get(p.tensor_key) if p.tensor_key is not None else None
        key = None
        if plan is not None:
            key = f"{key_prefix}g{len(out.plans):07d}"
            out.plans[key] = plan
        mine = replace(p, slot=f"dp{d}", tensor_key=key)
        out.unpaired[mine.id] = f"DP replica {d}'s ({rep.where}) partial grad: {PARTIAL_GRADS}"
        kept.append(mine)
    return kept


def _joined(
    rec: Record, peers: Sequence[Record], replicas: Sequence[Replica], out: Joined, key_prefix: str, dim: int
) -> Record | None:
    weights = [rep.weight if rec.kind in BACKWARD_KINDS else 1.0 for rep in replicas]
    shapes = "; ".join(f"{rep.where}: {list(p.shape)}" for rep, p in zip(replicas, peers, strict=True))
    if not rec.shape:  # one number per replica: a loss is their weighted mean, the rest unpaired
        values = [p.stats.mean if p.stats is not None and p.numel == 1 else None for p in peers]
        if rec.kind != "loss" or any(v is None for v in values):
            out.unpaired[rec.id] = (
                f"a tensor of no batch dim that differs across the DP replicas ({shapes}): it cannot be joined"
            )
            return None
        value = sum(rep.weight * v for rep, v in zip(replicas, values, strict=True) if v is not None)
        nan = sum(p.stats.nan for p in peers if p.stats is not None)
        inf = sum(p.stats.inf for p in peers if p.stats is not None)
        mean = Stats(value, value, value, abs(value), nan, inf)
        return replace(rec, stats=mean, crc32=None, tensor_key=None)
    if any(_without(p.shape, dim) != _without(rec.shape, dim) for p in peers):
        out.unpaired[rec.id] = (
            f"the DP replicas' shapes differ beyond the batch dim ({shapes}; padding to each rank's "
            "longest row?): it cannot be joined along the batch"
        )
        return None
    stats: Stats | None = None
    if all(p.stats is not None for p in peers):
        stats = merge_stats(
            [
                (_scaled(p.stats, w), p.numel)
                for p, w in zip(peers, weights, strict=True)
                if p.stats is not None
            ]
        )
    key = _joined_tensor(rec, peers, replicas, weights, out, key_prefix, dim)
    if stats is None and key is None:
        out.unpaired[rec.id] = (
            "recorded as a hash on the DP replicas: the hash of the joined batch is not a function of "
            "the replicas' hashes; record in stats or tensor mode to compare across DP sizes"
        )
        return None
    out.joined += 1
    out.parts[rec.id] = tuple(
        JoinedPart(
            rep.where, p.shape[dim], dim, _scaled(p.stats, w).as_dict() if p.stats is not None else None
        )
        for rep, p, w in zip(replicas, peers, weights, strict=True)
    )
    shape = list(rec.shape)
    shape[dim] = sum(p.shape[dim] for p in peers)
    return replace(rec, shape=tuple(shape), stats=stats, crc32=None, tensor_key=key)


def _scaled(stats: Stats, weight: float) -> Stats:
    if weight == 1.0:
        return stats
    return replace(
        stats,
        max=stats.max * weight,
        min=stats.min * weight,
        mean=stats.mean * weight,
        norm=stats.norm * weight,
    )


def _joined_tensor(
    rec: Record,
    peers: Sequence[Record],
    replicas: Sequence[Replica],
    weights: Sequence[float],
    out: Joined,
    key_prefix: str,
    dim: int,
) -> str | None:
    """A plan concatenating the replicas' tensors along ``dim`` (each scaled by its weight);
    None when a replica has no tensor, or its tensor is itself a merge of several ranks."""
    plans = []
    for rep, p in zip(replicas, peers, strict=True):
        plan = rep.plans.get(p.tensor_key) if p.tensor_key is not None else None
        if plan is None or len(plan.parts) != 1:
            return None
        plans.append(plan)
    key = f"{key_prefix}j{len(out.plans):07d}"
    rows = tuple(p.shape[dim] for p in peers)
    shape = list(rec.shape)
    shape[dim] = sum(rows)
    parts = tuple(plan.parts[0] for plan in plans)
    out.plans[key] = Plan("rows", dim, parts, tuple(shape), rec.id, rows=rows, scales=tuple(weights))
    return key


# -- two sides that split the global batch differently ------------------------------------------


def row_layout(trace: Trace, step: int) -> tuple[int, int]:
    """(DP replicas joined, module calls per replica) of ``step``: how its records hold the
    step's rows. Calls are those of the step's first record (the model's first micro-batch)."""
    block = trace.notes.dp_join.get(str(step))
    replicas = block.replicas if block is not None and block.joined else 1
    records = [r for r in trace.records if r.step == step and r.kind not in ("param", "param_grad")]
    if not records:
        return replicas, 0
    head = min(records, key=lambda r: r.seq)
    calls = sum(1 for r in records if (r.name, r.kind, r.slot) == (head.name, head.kind, head.slot))
    return replicas, calls


def _said(layout: tuple[int, int]) -> str:
    replicas, calls = layout
    ranks = f"{replicas} DP replicas joined" if replicas > 1 else "one replica"
    return f"{ranks} x {calls} micro-batch{'es' if calls != 1 else ''}"


def split_rows(baseline: Trace, candidate: Trace) -> dict[int, str]:
    """The steps whose module calls hold other rows on the two sides, where one side joined DP
    replicas (call ``c`` of a joined side is every replica's micro-batch ``c``; of one process,
    the ``c``-th slice of the batch): step -> how each side split it. Only one micro-batch per
    replica on both sides holds the same rows (the global batch in rank order)."""
    out: dict[int, str] = {}
    steps = {r.step for r in baseline.records} & {r.step for r in candidate.records}
    for step in sorted(steps):
        a, b = row_layout(baseline, step), row_layout(candidate, step)
        if max(a[0], b[0]) == 1 or a == b or (a[1] == 1 and b[1] == 1):
            continue
        out[step] = f"the baseline's {_said(a)}, the candidate's {_said(b)}"
    return out


def without_lone_replica_grads(baseline: Trace, candidate: Trace) -> tuple[Trace, Trace]:
    """The two sides without the per-replica partial grads (slot ``dp<d>``) the other side has
    no partner for (a run split otherwise): not compared, and not counted as unpaired -- the
    other side's grads say why they have no partner (``dp_join``'s reasons)."""
    ids = (baseline.by_id(), candidate.by_id())

    def kept(trace: Trace, other: Mapping[str, Record]) -> Trace:
        lone = {
            rid
            for block in trace.notes.dp_join.values()
            for rid in block.unpaired
            if rid not in other and rid.split("|")[2].startswith("dp")
        }
        if not lone:
            return trace
        return replace(trace, records=tuple(r for r in trace.records if r.id not in lone))

    return kept(baseline, ids[1]), kept(candidate, ids[0])
