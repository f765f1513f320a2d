"""Records built at the speed a recording step needs: a ``Record`` is a frozen dataclass, whose
``__init__`` sets each of its 15 fields through ``object.__setattr__``; these build the same
object from its fields directly (run for every tensor a step records, and for every record
whose statistics a step's end fetched)."""

from __future__ import annotations

import dataclasses

import torch

from ..trace.records import PHASE_OF_KIND, Record, Stats
from ..vocabulary import Kind
from .tensor_summary import dtype_name

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Record) if f.default is not dataclasses.MISSING}


def new_record(
    seq: int,
    name: str,
    module_class: str,
    kind: Kind,
    step: int,
    call: int,
    slot: str,
    tensor: torch.Tensor,
    stats: Stats | None,
    crc32: str | None,
    tensor_key: str | None,
    deps: tuple[str, ...],
) -> Record:
    """The ``Record`` of ``tensor``, built without the frozen dataclass's ``__init__`` (it sets
    each of its 15 fields through ``object.__setattr__``): run for every tensor a step records."""
    dtype = tensor.dtype
    new = object.__new__(Record)
    fields = {
        **_DEFAULTS,
        "seq": seq,
        "name": name,
        "module_class": module_class,
        "phase": PHASE_OF_KIND[kind],
        "step": step,
        "call": call,
        "kind": kind,
        "slot": slot,
        "dtype": _DTYPES.get(dtype) or dtype_name(dtype),
        "shape": tuple(tensor.shape),
        "stats": stats,
        "crc32": crc32,
        "tensor_key": tensor_key,
        "deps": deps,
    }
    object.__setattr__(new, "__dict__", fields)
    return new


_DTYPES = {
    d: dtype_name(d) for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64)
}


def with_summary(record: Record, stats: Stats | None, crc: str | None) -> Record:
    """``dataclasses.replace(record, stats=stats, crc32=crc)``, as ``new_record``: run for every
    record whose statistics a step's end fetched."""
    new = object.__new__(Record)
    new.__dict__.update(record.__dict__, stats=stats, crc32=crc)
    return new
