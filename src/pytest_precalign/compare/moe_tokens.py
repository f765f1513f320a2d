"""MoE blocks compared for what they mean: each expert's rows keyed by token, not by dispatch order.

Two correct dispatchers (a loop over experts with ``torch.where`` token subsets, a
permute/sort-by-expert dispatcher) call expert ``E`` with the same tokens in different orders
and possibly in a different number of calls. Paired positionally, ``experts.E`` fails while the
block's output matches. ``by_token`` rewrites both traces before the compare (tensor mode):

* Each row an expert receives is matched to a token of its MoE block's input by exact equality
  of the hidden-state row against the block's flattened input (``in.0`` reshaped to
  ``[tokens, hidden]``). Cost: one hash of each block input row and each expert input row per
  block call (bytes hashed = block input + expert inputs), no tensor arithmetic.
* Every record of that expert call and of the modules inside it (inputs, outputs, their grads)
  is cut into the same rows and re-assembled in token order, one record per (expert, block
  call) whatever the number of calls: ``...experts.3`` call ``c`` is block call ``c``'s tokens
  routed to expert 3, in token order, on both sides.
* The routing: a record ``<block>.routing`` per block call, the hash of a ``[tokens, experts]``
  0/1 matrix (1 where the token's row reached that expert; experts of both sides), compared
  for equality: exact whatever the tolerance table says. A token routed differently is a
  finding there; its rows at every expert it reached are unmatched with that reason, never
  dropped.
* A row that matches no token of the block's input (the expert saw a transformed input) and a
  record whose rows do not follow the expert's input rows are kept unmatched, with the reason.

An expert called on an empty slice (a dispatcher that calls every expert) has no rows: its
records hold no values and leave no trace. Identical input rows (the same token twice) are
interchangeable: they produce identical rows in every expert, so either token index is right.
A ``block`` or ``experts`` glob matching nothing on either side is a ``ConfigError``. Param grads and records outside experts are
left as they were.
"""

from __future__ import annotations

import fnmatch
import zlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..trace.records import Record, Stats, TensorOverlay, Trace

_NOT_ROWS = ("param", "param_grad", "logits", "loss")


@dataclass(frozen=True)
class MoeSpec:
    """``block``: glob of the MoE block modules; ``experts``: glob of its experts, relative to it."""

    block: str
    experts: str = "experts.*"


@dataclass(frozen=True)
class MoeResult:
    baseline: Trace
    candidate: Trace
    reasons: Mapping[str, str]  # record id -> why it has no partner


_BlockKey = tuple[int, str, int]  # step, block name, block call
_RowKey = tuple[int, str, int, str, str, str]  # step, block name, block call, record name, kind, slot


@dataclass
class _Side:
    """One side's expert rows, by block call and record, token -> row."""

    rows: dict[_RowKey, dict[int, Any]]
    proto: dict[_RowKey, Record]  # a record to copy metadata from
    routed: dict[_BlockKey, dict[str, set[int]]]  # block call -> expert -> tokens
    tokens: dict[_BlockKey, int]  # block call -> number of tokens
    first_seq: dict[_BlockKey, int]  # block call -> seq of its input record
    loose: list[tuple[Record, Any, str]]  # records kept unmatched, with their reason
    consumed: set[str]  # ids of the original records replaced


def by_token(baseline: Trace, candidate: Trace, spec: MoeSpec) -> MoeResult:
    """Both traces with their expert records keyed by token (see the module doc)."""
    sides = (_collect(baseline, spec), _collect(candidate, spec))
    for who, side in zip(("baseline", "candidate"), sides, strict=True):
        _check_found(side, spec, who)
    reasons: dict[str, str] = {}
    out: list[Trace] = []
    for i, (trace, side) in enumerate(zip((baseline, candidate), sides, strict=True)):
        other = sides[1 - i]
        who = ("baseline", "candidate")[i]
        out.append(_rebuild(trace, side, other, who, reasons))
    return MoeResult(out[0], out[1], reasons)


def _check_found(side: _Side, spec: MoeSpec, who: str) -> None:
    """A ``record.moe`` glob that matches nothing is an error, not a silent positional compare."""
    if not side.tokens:
        raise ConfigError(
            f"record.moe.block {spec.block!r} matched no module input recorded by the {who} "
            "(a glob of MoE block module names, e.g. 'model.layers.*.mlp')"
        )
    if not side.routed:
        blocks = sorted({b for _, b, _ in side.tokens})
        raise ConfigError(
            f"record.moe.experts {spec.experts!r} matched no module called inside {blocks[0]!r} "
            f"on the {who} (a glob relative to the block, e.g. 'experts.*')"
        )


def _row_key(row: Any) -> bytes:
    return bytes(np.ascontiguousarray(row).tobytes())


def _collect(trace: Trace, spec: MoeSpec) -> _Side:
    side = _Side(defaultdict(dict), {}, defaultdict(lambda: defaultdict(set)), {}, {}, [], set())
    records = trace.records
    for rec in records:
        if rec.kind != "input" or rec.slot != "in.0" or not fnmatch.fnmatchcase(rec.name, spec.block):
            continue
        out = _find_out(records, rec)
        x = trace.array(rec)
        if out is None or x is None:
            continue
        flat = x.reshape(-1, x.shape[-1])
        where: dict[bytes, list[int]] = defaultdict(list)
        for t in range(flat.shape[0]):
            where[_row_key(flat[t])].append(t)
        bkey = (rec.step, rec.name, rec.call)
        side.tokens[bkey] = flat.shape[0]
        side.first_seq[bkey] = rec.seq
        pattern = f"{rec.name}.{spec.experts}"
        inside = [r for r in records if rec.seq < r.seq < out.seq and r.step == rec.step]
        for exp in inside:
            if (
                exp.kind == "input"
                and exp.slot == "in.0"
                and fnmatch.fnmatchcase(exp.name, pattern)
                and exp.name.count(".") == pattern.count(".")
            ):
                _expert_call(trace, side, bkey, exp, where, inside)
    return side


def _find_out(records: tuple[Record, ...], rec: Record) -> Record | None:
    for r in records:
        if (r.name, r.kind, r.step, r.call) == (rec.name, "activation", rec.step, rec.call):
            return r
    return None


def _expert_call(
    trace: Trace,
    side: _Side,
    bkey: _BlockKey,
    exp: Record,
    where: Mapping[bytes, list[int]],
    inside: list[Record],
) -> None:
    x = trace.array(exp)
    if x is None:
        return
    rows = x.reshape(-1, x.shape[-1])
    used: dict[bytes, int] = defaultdict(int)
    tokens: list[int] = []
    for r in range(rows.shape[0]):
        key = _row_key(rows[r])
        found = where.get(key, [])
        n = used[key]
        used[key] += 1
        tokens.append(found[n % len(found)] if found else -1)
    side.routed[bkey][exp.name].update(t for t in tokens if t >= 0)
    # The expert's own records and those of modules inside it, forward calls within this call.
    calls = {(r.name, r.call) for r in inside if r.name == exp.name or r.name.startswith(exp.name + ".")}
    calls = {c for c in calls if c[0] != exp.name or c[1] == exp.call}
    members = [r for r in trace.records if (r.name, r.call) in calls and r.step == exp.step]
    for rec in members:
        if rec.kind in _NOT_ROWS:
            continue
        side.consumed.add(rec.id)
        arr = trace.array(rec)
        if not tokens and arr is not None and arr.size == 0:
            continue  # an empty slice's record: no values to lose
        lead = int(np.prod(arr.shape[:-1])) if arr is not None and arr.ndim >= 2 else -1
        if arr is not None and lead == len(tokens) and tokens:
            arr = arr.reshape(lead, arr.shape[-1])  # [1, n, hidden] and [n, hidden] alike
        else:
            why = f"its rows do not follow {exp.name}'s input rows (shape {list(rec.shape)})"
            side.loose.append((rec, arr, why))
            continue
        rkey: _RowKey = (bkey[0], bkey[1], bkey[2], rec.name, rec.kind, rec.slot)
        side.proto.setdefault(rkey, rec)
        for r, t in enumerate(tokens):
            if t < 0:
                why = f"its row {r} matches no token of {bkey[1]}'s input"
                side.loose.append((replace(rec, slot=f"{rec.slot}@row{r}"), arr[r : r + 1], why))
            else:
                side.rows[rkey][t] = arr[r]


def _rebuild(trace: Trace, side: _Side, other: _Side, who: str, reasons: dict[str, str]) -> Trace:
    out = _Rebuilt({}, defaultdict(list))
    for bkey, n in side.tokens.items():
        _routing(out, bkey, n, side, other)
    for key, rows in side.rows.items():
        _expert_rows(out, key, rows, side, other, who, reasons)
    for rec, arr, why in side.loose:
        rec = replace(rec, slot=rec.slot if "@" in rec.slot else f"{rec.slot}@unmatched")
        reasons[rec.id] = why
        if arr is None:
            out.placed[rec.seq].append(rec)
        else:
            out.put(rec, arr, rec.seq)
    records: list[Record] = []
    for rec in trace.records:
        if rec.id not in side.consumed:
            records.append(rec)
        records.extend(out.placed.pop(rec.seq, []))
    for rest in out.placed.values():
        records.extend(rest)
    renumbered = tuple(replace(r, seq=i) for i, r in enumerate(records))
    return Trace(trace.manifest, renumbered, TensorOverlay(trace.tensors, out.tensors), trace.run)


@dataclass
class _Rebuilt:
    tensors: dict[str, Any]
    placed: dict[int, list[Record]]  # original seq -> new records placed after it
    chosen: dict[tuple[int, _BlockKey], dict[int, frozenset[str]]] = field(default_factory=dict)

    def choices(self, side: _Side, bkey: _BlockKey) -> dict[int, frozenset[str]]:
        key = (id(side), bkey)
        if key not in self.chosen:
            self.chosen[key] = _choices(side, bkey)
        return self.chosen[key]

    def put(self, rec: Record, arr: Any, at: int) -> None:
        key = f"moe{len(self.tensors):07d}"
        self.tensors[key] = arr
        new = replace(rec, shape=tuple(arr.shape), tensor_key=key, stats=_stats(arr), crc32=None)
        self.placed[at].append(new)


def _routing(out: _Rebuilt, bkey: _BlockKey, n: int, side: _Side, other: _Side) -> None:
    """The block call's routing as a 0/1 ``[tokens, experts]`` record (experts of both sides)."""
    mine, theirs = side.routed.get(bkey, {}), other.routed.get(bkey, {})
    experts = sorted(set(mine) | set(theirs), key=_natural)
    mask = np.zeros((n, len(experts)), dtype=np.int64)
    for j, name in enumerate(experts):
        for t in mine.get(name, ()):
            mask[t, j] = 1
    step, block, call = bkey
    # No tensor and no statistics, only a hash: the compare checks it for equality, exactly,
    # whatever the tolerance table says.
    crc = f"{zlib.crc32(np.ascontiguousarray(mask).tobytes()):08x}"
    rec = Record(
        0,
        f"{block}.routing",
        "routing",
        "forward",
        step,
        call,
        "activation",
        "out",
        "int64",
        mask.shape,
        crc32=crc,
    )
    out.placed[side.first_seq[bkey]].append(rec)


def _choices(side: _Side, bkey: _BlockKey) -> dict[int, frozenset[str]]:
    """Token -> the experts its row reached, in one block call."""
    chosen: dict[int, set[str]] = defaultdict(set)
    for expert, tokens in side.routed.get(bkey, {}).items():
        for t in tokens:
            chosen[t].add(expert)
    return {t: frozenset(e) for t, e in chosen.items()}


def _expert_rows(
    out: _Rebuilt,
    key: _RowKey,
    rows: Mapping[int, Any],
    side: _Side,
    other: _Side,
    who: str,
    reasons: dict[str, str],
) -> None:
    """One record of the tokens both sides routed alike, in token order; the others unmatched."""
    proto = side.proto[key]
    bkey: _BlockKey = (key[0], key[1], key[2])
    mine, theirs = out.choices(side, bkey), out.choices(other, bkey)
    common = sorted(t for t in rows if mine.get(t) == theirs.get(t))
    if common:
        out.put(replace(proto, call=bkey[2]), np.stack([rows[t] for t in common]), proto.seq)
    for t in sorted(set(rows) - set(common)):
        lone = replace(proto, call=bkey[2], slot=f"{proto.slot}@token{t}")
        here, there = sorted(mine.get(t, ()), key=_natural), sorted(theirs.get(t, ()), key=_natural)
        reasons[lone.id] = (
            f"token {t} of {bkey[1]} (call {bkey[2]}) is routed differently: to {here} on the {who}, "
            f"to {there} on the other side (see {bkey[1]}.routing)"
        )
        out.put(lone, rows[t][None], proto.seq)


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in name.split("."))


def _stats(arr: Any) -> Stats:
    a = np.asarray(arr, dtype=np.float64).ravel()
    ok = np.isfinite(a)
    finite = a if ok.all() else a[ok]
    nan = int(np.isnan(a).sum()) if finite is not a else 0
    inf = a.size - finite.size - nan
    if finite.size == 0:
        return Stats(float("nan"), float("nan"), float("nan"), float("nan"), nan, inf)
    return Stats(
        float(finite.max()),
        float(finite.min()),
        float(finite.mean()),
        float(np.linalg.norm(finite)),
        nan,
        inf,
    )
