"""Records built at the speed a recording step needs. During a step a recorder keeps each record
as a ``Draft``, a plain tuple of what the hook knew (a hook runs right after a torch operation
has pushed the interpreter's data out of the caches: every object it makes costs misses); the
step's end builds the ``Record`` of each draft in one loop (``new_record``). A ``Record`` is a
frozen dataclass, whose ``__init__`` sets each of its 15 fields through ``object.__setattr__``;
``new_record`` builds the same object from its fields directly."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from ..trace.records import PHASE_OF_KIND, Record, Stats, record_id
from ..vocabulary import Kind
from .tensor_summary import dtype_name

# A record whose step has not ended: name, module class, kind, step, call, slot, the tensor's
# dtype and shape as torch gave them, deps (record ids, or the seqs of this recorder's records),
# statistics (a ``StatsSlots`` index, ``Stats``, or None: fetched at the step's end or none),
# CRC-32 and tensor key.
Draft = tuple[
    str,
    str,
    Kind,
    int,
    int,
    str,
    torch.dtype,
    Sequence[int],
    tuple[str | int, ...],
    "int | Stats | None",
    str | None,
    str | None,
]


def draft_id(draft: Draft) -> str:
    """The id the draft's record will have (``Record.id``)."""
    return record_id(draft[0], draft[2], draft[5], draft[3], draft[4])


def new_record(
    seq: int,
    name: str,
    module_class: str,
    kind: Kind,
    step: int,
    call: int,
    slot: str,
    dtype: torch.dtype,
    shape: Sequence[int],
    stats: Stats | None,
    crc32: str | None,
    tensor_key: str | None,
    deps: tuple[str, ...],
) -> Record:
    """The ``Record`` of a tensor of ``dtype`` and ``shape``, built without the frozen
    dataclass's ``__init__`` (it sets each of its 15 fields through ``object.__setattr__``): run
    for every tensor a step records."""
    new = object.__new__(Record)
    fields = {
        "seq": seq,
        "name": name,
        "module_class": module_class,
        "phase": PHASE_OF_KIND[kind],
        "step": step,
        "call": call,
        "kind": kind,
        "slot": slot,
        "dtype": _DTYPES.get(dtype) or dtype_name(dtype),
        "shape": tuple(shape),
        "stats": stats,
        "crc32": crc32,
        "tensor_key": tensor_key,
        "deps": deps,
        "merged": (),
    }
    object.__setattr__(new, "__dict__", fields)
    return new


_DTYPES = {
    d: dtype_name(d) for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64)
}


def build_drafts(
    records: list[Record | Draft],
    start: int,
    fetched: Mapping[int, tuple[Stats | None, str | None]],
    slot_stats: Callable[[int, int], Stats] | None,
) -> None:
    """Replace each draft in ``records[start:]`` with its ``Record``, in one loop (a step's end):
    statistics and CRC from ``fetched`` (by seq: what the step buffer fetched), from a slot
    (``slot_stats(index, numel)``; records that share a slot share its ``Stats``) or the
    draft's own; deps given as seqs turned into record ids."""
    ids: dict[int, str] = {}
    by_slot: dict[int, Stats] = {}
    for seq in range(start, len(records)):
        d = records[seq]
        if isinstance(d, tuple):  # else built at capture (live compare)
            records[seq] = _record_of(records, seq, d, fetched.get(seq), slot_stats, by_slot, ids)


def record_now(
    records: list[Record | Draft], seq: int, slot_stats: Callable[[int, int], Stats] | None
) -> Record:
    """Record ``seq`` as known now: built already, or built from its draft (not kept; statistics
    still to be fetched are not in it)."""
    d = records[seq]
    return d if isinstance(d, Record) else _record_of(records, seq, d, None, slot_stats, {}, {})


def _record_of(
    records: list[Record | Draft],
    seq: int,
    d: Draft,
    fetched: tuple[Stats | None, str | None] | None,
    slot_stats: Callable[[int, int], Stats] | None,
    by_slot: dict[int, Stats],
    ids: dict[int, str],
) -> Record:
    name, module_class, kind, step, call, slot, dtype, shape, deps, summary, crc, key = d
    if fetched is not None:
        stats, crc = fetched
    elif isinstance(summary, int):
        stats = by_slot.get(summary)
        if stats is None:
            assert slot_stats is not None  # only the slots give an index
            stats = by_slot[summary] = slot_stats(summary, math.prod(shape))
    else:
        stats = summary
    named: list[str] = []
    for dep in deps:
        if isinstance(dep, str):
            named.append(dep)
            continue
        rid = ids.get(dep)
        if rid is None:
            entry = records[dep]
            rid = ids[dep] = entry.id if isinstance(entry, Record) else draft_id(entry)
        named.append(rid)
    return new_record(
        seq, name, module_class, kind, step, call, slot, dtype, shape, stats, crc, key, tuple(named)
    )
