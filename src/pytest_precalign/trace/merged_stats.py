"""Statistics of several records merged into the statistics of their concatenation.

Where one side fuses tensors the other keeps apart (Megatron's ``linear_qkv`` output against
HF's ``q_proj``, ``k_proj``, ``v_proj``; ``linear_fc1`` against ``gate_proj`` and ``up_proj``),
statistics cannot be split, but they can be merged: the fused tensor holds the same elements
as the parts, rearranged, so its max is the max of the parts' maxes, its min the min of their
mins, its mean their element-weighted mean and its L2 norm the root of their summed squared
norms (msprobe's ``parallel_merge`` merges shards' statistics the same way). NaN/Inf counts add.
Pure data, no torch import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from .records import Record, Stats, Trace, record_id


def merge_stats(parts: Sequence[tuple[Stats, int]]) -> Stats:
    """The statistics of the concatenation of ``parts`` (each: its statistics and element
    count). A NaN max, min or mean in any part is NaN in the merge (as ``aminmax`` over the
    whole would say); empty parts add nothing."""
    full = [(s, n) for s, n in parts if n > 0]
    if not full:
        return Stats(0.0, 0.0, 0.0, 0.0)
    total = sum(n for _, n in full)
    return Stats(
        max=_nan_or([s.max for s, _ in full], max),
        min=_nan_or([s.min for s, _ in full], min),
        mean=sum(s.mean * n for s, n in full) / total,
        norm=math.sqrt(sum(s.norm * s.norm for s, _ in full)),
        nan=sum(s.nan for s, _ in full),
        inf=sum(s.inf for s, _ in full),
    )


def _nan_or(values: list[float], pick: Callable[[list[float]], float]) -> float:
    """``pick(values)``, or NaN when one of them is NaN (``max`` alone depends on the order)."""
    if any(v != v for v in values):
        return math.nan
    return float(pick(values))


def merged_name(names: Sequence[str]) -> str:
    """One name for records merged together: their common dotted prefix and suffix around the
    parts that differ, in braces (``model.layers.0.self_attn.{q_proj,k_proj,v_proj}.weight``);
    a single name is itself."""
    if len(names) == 1:
        return names[0]
    split = [n.split(".") for n in names]
    shortest = min(len(s) for s in split)
    head = 0
    while head < shortest - 1 and all(s[head] == split[0][head] for s in split):
        head += 1
    tail = 0
    while tail < shortest - head - 1 and all(s[-1 - tail] == split[0][-1 - tail] for s in split):
        tail += 1
    middles = [".".join(s[head : len(s) - tail]) for s in split]
    parts = [*split[0][:head], "{" + ",".join(middles) + "}", *split[0][len(split[0]) - tail :]]
    return ".".join(parts)


def merged_record(parts: Sequence[Record]) -> Record:
    """One record standing for ``parts`` (one module's records of one kind, slot, step and
    call): their merged statistics under their merged name, their element count as its shape,
    where the last of them was recorded (by then all were), computed from all their deps."""
    last = max(parts, key=lambda r: r.seq)
    stats = merge_stats([(r.stats, r.numel) for r in parts if r.stats is not None])
    deps = tuple(dict.fromkeys(d for r in parts for d in r.deps))
    return replace(
        last,
        name=merged_name([r.name for r in parts]),
        shape=(sum(r.numel for r in parts),),
        stats=stats,
        crc32=None,
        tensor_key=None,
        deps=deps,
        merged=tuple(r.name for r in parts),
    )


def member_ids(record: Record) -> tuple[str, ...]:
    """The ids of the records a merged record stands for."""
    return tuple(record_id(n, record.kind, record.slot, record.step, record.call) for n in record.merged)


def with_merged(trace: Trace, merged: Sequence[Record]) -> Trace:
    """``trace`` with each merged record in place of the records it stands for (at the last of
    them), and the deps of other records on those pointing at it."""
    if not merged:
        return trace
    into = {part: rec for rec in merged for part in member_ids(rec)}
    records: list[Record] = []
    for rec in trace.records:
        if rec.id in into:
            whole = into[rec.id]
            if rec.seq == whole.seq:
                records.append(whole)
            continue
        deps = tuple(dict.fromkeys(into[d].id if d in into else d for d in rec.deps))
        records.append(rec if deps == rec.deps else replace(rec, deps=deps))
    return replace(trace, records=tuple(records))
