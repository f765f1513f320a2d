"""What one training step did, as scalars: the per-step evidence of a training run.

Recorded by cases, the ``Recorder`` and ``PrecalignCallback`` for every optimizer step, kept
in the step's trace manifest under ``"scalars"`` (``{"<step>": {...}}``, see
``scalars_of``), so a run of thousands of steps costs a few hundred bytes per step.

Fields are None when the side's framework does not have the quantity (never 0 for unknown):

- ``loss``: the step's loss as the framework reports it (normalised over the micro-batches).
- ``lr`` / ``weight_decay``: per parameter group, in the framework's group order.
- ``grad_norm``: global L2 norm of the grads before clipping; ``clip_coef``: the factor the
  grads were multiplied by (1.0 when not clipped).
- ``update_norm``: L2 norm of (params after - params before) of the step, "before" being
  the params at the last step's end when they were not written in place since (a write
  through ``.data`` between steps counts in it; ``StepEvidence.begin``); ``param_norm``:
  L2 norm of the params after the step.
- ``zero_grads``: number of grad elements exactly 0; ``loss_scale`` (mixed precision);
  ``skipped``: the optimizer skipped the update (overflow).
- ``tokens``: tokens in the step's batch (labels not ignored); ``batch_hash``: sha256 of the
  step's batch (each row's input ids and labels at its attended positions, whatever the
  padding and the micro-batch split), so differing data is seen as differing data.
- ``rows_hash``: the step's rows as a multiset -- the sum modulo 2**256 of each row's sha256
  (the bytes ``batch_hash`` hashes of it) -- so the rows of a data-parallel run's replicas add
  up to the hash of their global batch (``add_rows_hashes``) whatever the split and the order
  of the rows in the step: a one-process run and a DP run are compared on the rows each step
  trained on (``batch_hash`` only compares runs split alike).
- ``micro_batches``: how many micro-batches the step was split into.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..errors import TraceError
from .json_fields import field_dict

SCALARS_KEY = "scalars"
# A data-parallel run's step whose replicas trained on different rows (``parallel.dp_scalars``):
# its batch hash is its replicas' hashes in rank order, marked so -- the global batch's sha256
# is not a function of its shards' -- and compared only with another such hash.
JOINED_HASH = "dp-replicas:"


ROWS_MODULUS = 1 << 256


def add_rows_hashes(hashes: Sequence[str]) -> str:
    """The ``rows_hash`` of the union of the rows ``hashes`` stand for (each a ``rows_hash``)."""
    total = sum(int(h, 16) for h in hashes) % ROWS_MODULUS
    return f"{total:064x}"


def comparable_hashes(a: str | None, b: str | None) -> bool:
    """Both batch hashes known and of one kind (both a global batch's, or both DP replicas')."""
    return a is not None and b is not None and a.startswith(JOINED_HASH) == b.startswith(JOINED_HASH)


@dataclass(frozen=True)
class StepScalars:
    step: int
    loss: float | None = None
    lr: tuple[float, ...] | None = None
    weight_decay: tuple[float, ...] | None = None
    grad_norm: float | None = None
    clip_coef: float | None = None
    update_norm: float | None = None
    param_norm: float | None = None
    zero_grads: int | None = None
    loss_scale: float | None = None
    skipped: bool | None = None
    tokens: int | None = None
    batch_hash: str | None = None
    micro_batches: int | None = None
    rows_hash: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return field_dict(self)


_FIELDS = {f.name for f in fields(StepScalars)}


# Each field's JSON type: a number (NaN / Inf allowed: the verdict judges them), a list of
# numbers, a count, a flag or a text; every field may be null.
_NUMBERS = ("loss", "grad_norm", "clip_coef", "update_norm", "param_norm", "loss_scale")
_COUNTS = ("step", "zero_grads", "tokens", "micro_batches")
_LISTS = ("lr", "weight_decay")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _field(key: str, value: Any, where: str) -> Any:
    """One field's value from JSON, typed; a TraceError naming the key and what is allowed."""
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    if key in _NUMBERS:
        if not _is_number(value):
            raise TraceError(f"{where}.{key}: expected a number or null, got {type(value).__name__} {shown}")
        return float(value) if not isinstance(value, int) or abs(value) < 1 << 1023 else math.inf
    if key in _COUNTS:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TraceError(f"{where}.{key}: expected an integer >= 0, got {type(value).__name__} {shown}")
        return value
    if key in _LISTS:
        if not isinstance(value, list) or not all(_is_number(v) for v in value):
            raise TraceError(f"{where}.{key}: expected a list of numbers (one per group), got {shown}")
        return tuple(float(v) for v in value)
    if key == "skipped":
        if not isinstance(value, bool):
            raise TraceError(f"{where}.skipped: expected true, false or null, got {shown}")
        return value
    if not isinstance(value, str):  # batch_hash
        raise TraceError(f"{where}.{key}: expected a string or null, got {type(value).__name__} {shown}")
    return value


def scalars_from_dict(data: Mapping[str, Any], where: str) -> StepScalars:
    """One step's scalars from JSON; TraceError naming ``where`` and the key otherwise."""
    unknown = set(data) - _FIELDS
    if unknown:
        raise TraceError(
            f"{where}: unknown step scalar(s) {sorted(unknown)[:5]} (allowed: {sorted(_FIELDS)})"
        )
    if "step" not in data or data["step"] is None:
        raise TraceError(f"{where}: no 'step' (the optimizer step, an integer >= 0)")
    values: dict[str, Any] = {
        key: None if value is None else _field(key, value, where) for key, value in data.items()
    }
    return StepScalars(**values)


def scalars_of(manifest: Mapping[str, Any], where: str = "manifest") -> dict[int, StepScalars]:
    """The per-step scalars a trace manifest carries, by step (empty when it has none)."""
    raw = manifest.get(SCALARS_KEY)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise TraceError(f"{where}: {SCALARS_KEY!r} must be a mapping of step -> scalars")
    out: dict[int, StepScalars] = {}
    for key, value in raw.items():
        if not isinstance(value, Mapping):
            raise TraceError(f"{where}: {SCALARS_KEY}[{key!r}] must be a mapping")
        scalars = scalars_from_dict(value, f"{where}: {SCALARS_KEY}[{key!r}]")
        if str(scalars.step) != str(key):
            raise TraceError(f"{where}: {SCALARS_KEY}[{key!r}] says step {scalars.step}")
        out[scalars.step] = scalars
    return out


def scalars_manifest(scalars: Mapping[int, StepScalars]) -> dict[str, dict[str, Any]]:
    """The manifest value for ``scalars``: JSON-safe, keyed by the step as a string."""
    return {str(step): s.as_dict() for step, s in sorted(scalars.items())}
