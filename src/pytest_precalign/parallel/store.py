"""The merged tensor store: ``array(key)`` reads one merged tensor's shards from the ranks'
files and puts them together only then (no torch).

Shards of our traces are read with plain file reads into fresh arrays rather than through the
trace's memory map (whose touched pages would stay resident, and counted, for as long as the
file is mapped), so a merged compare holds one merged tensor pair and one shard at a time.
Replicated tensors are checked bitwise across TP ranks as they are read, in slices.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TraceError
from ..trace.arrays import as_numpy
from ..trace.records import Trace
from ..trace.tensor_files import bf16_to_float32
from ..untrusted import bounded_repr, loads_json

_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
_SLICE = 1 << 22  # elements per slice when replicas are checked


@dataclass(frozen=True)
class Part:
    """One rank's tensor: its trace (for the store) and key; ``where`` names the rank folder."""

    trace: Trace
    key: str
    where: str


@dataclass(frozen=True)
class Plan:
    """How a merged tensor is made: ``replicated`` (the first part; the others must equal it),
    ``chunk`` (concatenated on ``dim``), ``gated`` (every part's first half, then every
    part's second half, on ``dim``) or ``rows`` (DP replicas joined along the batch: part
    ``i`` holds ``rows[i]`` rows of ``dim``, multiplied by ``scales[i]``; ``dp_join.py``)."""

    layout: str
    dim: int
    parts: tuple[Part, ...]
    shape: tuple[int, ...]
    name: str  # a record id, for messages
    rows: tuple[int, ...] = ()
    scales: tuple[float, ...] = ()


def _check_entry(path: Path, key: str, item: Any, data_bytes: int) -> None:
    """A header entry whose byte range lies inside the file: nothing is allocated from a
    range the file does not hold."""
    offsets = item.get("data_offsets") if isinstance(item, dict) else None
    shape = item.get("shape") if isinstance(item, dict) else None
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
        and isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise TraceError(
            f"{path}: tensor {key!r}: expected {{dtype, shape: [ints], data_offsets: [begin, end]}} inside "
            f"the file's {data_bytes} data bytes, got {bounded_repr(item)}"
        )


class _Header:
    """A safetensors file's header, read once: key -> (numpy dtype, shape, byte range)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                (length,) = struct.unpack("<Q", f.read(8))
                if length > size - 8:  # checked before anything is sized by it
                    raise TraceError(f"{path}: not a safetensors file (header runs past the end; truncated?)")
                raw = f.read(length)
        except (OSError, struct.error, ValueError) as exc:
            raise TraceError(f"{path}: not a readable safetensors file: {exc}") from None
        header = loads_json(raw, TraceError, path, bad="not a readable safetensors file")
        if not isinstance(header, dict):
            raise TraceError(f"{path}: not a safetensors file (header is not an object)")
        self.base = 8 + length
        self.entries: dict[str, tuple[str, str, tuple[int, ...], int, int]] = {}
        for key, item in header.items():
            if key == "__metadata__":
                continue
            _check_entry(path, key, item, size - self.base)
            dtype = _DTYPES.get(str(item.get("dtype")))
            if dtype is None:
                raise TraceError(
                    f"{path}: tensor {key!r} has dtype {item.get('dtype')!r} (readable: {', '.join(_DTYPES)})"
                )
            begin, end = (int(x) for x in item["data_offsets"])
            self.entries[key] = (str(item["dtype"]), dtype, tuple(int(d) for d in item["shape"]), begin, end)

    def read(self, key: str, start: int = 0, count: int | None = None) -> np.ndarray:
        """Elements ``start .. start+count`` of the flattened tensor (all by default)."""
        if key not in self.entries:
            raise TraceError(f"{self.path}: holds no tensor {key!r}")
        st_dtype, dtype, shape, begin, end = self.entries[key]
        itemsize = np.dtype(dtype).itemsize
        total = (end - begin) // itemsize
        n = total - start if count is None else min(count, total - start)
        out = np.empty(n, dtype=dtype)
        with open(self.path, "rb") as f:
            got = os.preadv(f.fileno(), [out.data], self.base + begin + start * itemsize)
        if got != n * itemsize:
            raise TraceError(f"{self.path}: tensor {key!r} runs past the end of the file (truncated?)")
        if st_dtype == "BF16":
            out = bf16_to_float32(out)
        return out.reshape(shape) if count is None and start == 0 else out


class _Readers:
    """Reads parts: plain file reads for our traces' shards, the store's own reader else."""

    def __init__(self) -> None:
        self._headers: dict[Path, _Header] = {}

    def _header(self, part: Part) -> tuple[_Header, str] | None:
        store = part.trace.tensors
        root, shards = getattr(store, "_root", None), getattr(store, "_shards", None)
        if not isinstance(root, Path) or not isinstance(shards, dict) or part.key not in shards:
            return None
        path = root / shards[part.key]
        if path not in self._headers:
            if not path.is_file():
                raise TraceError(f"{root}: index.json names {shards[part.key]}, which is missing")
            self._headers[path] = _Header(path)
        return self._headers[path], part.key

    def load(self, part: Part, shape: tuple[int, ...]) -> np.ndarray:
        found = self._header(part)
        if found is not None:
            array = found[0].read(found[1])
        else:
            store = part.trace.tensors
            reader = getattr(store, "array", None)
            array = reader(part.key) if reader is not None else as_numpy(store[part.key])
        if tuple(array.shape) != shape:
            raise TraceError(
                f"{part.where}: tensor {part.key!r} has shape {list(array.shape)}, its record says {list(shape)}"
            )
        return array

    def slices(self, part: Part, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
        """The flattened tensor in slices of at most ``_SLICE`` elements."""
        found = self._header(part)
        numel = int(np.prod(shape)) if shape else 1
        if found is None:
            flat = self.load(part, shape).reshape(-1)
            for start in range(0, numel, _SLICE):
                yield flat[start : start + _SLICE]
            return
        for start in range(0, numel, _SLICE):
            yield found[0].read(found[1], start, _SLICE)


class MergedTensors(Mapping[str, Any]):
    """Merged key -> numpy array, built from the plans on access only."""

    def __init__(self, plans: Mapping[str, Plan]) -> None:
        self._plans = dict(plans)
        self._readers = _Readers()

    def plan(self, key: str) -> Plan:
        return self._plans[key]

    def array(self, key: str) -> np.ndarray:
        plan = self._plans[key]
        part_shape = _part_shape(plan)
        if plan.layout == "replicated":
            return self._replicated(plan, part_shape)
        if plan.layout == "rows":
            return self._rows(plan)
        first = self._readers.load(plan.parts[0], part_shape)
        out = np.empty(plan.shape, dtype=first.dtype)
        dim, n = plan.dim, len(plan.parts)
        for r, part in enumerate(plan.parts):
            shard = first if r == 0 else self._readers.load(part, part_shape)
            if plan.layout == "chunk":
                _place(out, shard, dim, r * part_shape[dim])
            else:  # gated: [gate_r; up_r] -> gate at r, up at n + r
                half = part_shape[dim] // 2
                gate, up = np.split(shard, 2, axis=dim)
                _place(out, gate, dim, r * half)
                _place(out, up, dim, (n + r) * half)
            del shard
        return out

    def _rows(self, plan: Plan) -> np.ndarray:
        pieces = []
        for part, rows, scale in zip(plan.parts, plan.rows, plan.scales, strict=True):
            shape = list(plan.shape)
            shape[plan.dim] = rows
            piece = self._readers.load(part, tuple(shape))
            pieces.append(piece if scale == 1.0 else piece * np.asarray(scale, dtype=piece.dtype))
        return np.concatenate(pieces, axis=plan.dim)

    def _replicated(self, plan: Plan, shape: tuple[int, ...]) -> np.ndarray:
        kept = self._readers.load(plan.parts[0], shape)
        flat = kept.reshape(-1)
        nan_ok = flat.dtype.kind in "fc"
        for part in plan.parts[1:]:
            start = 0
            for piece in self._readers.slices(part, shape):
                mine = flat[start : start + piece.size]
                if not np.array_equal(mine, piece, equal_nan=nan_ok):
                    diff = np.abs(mine.astype(np.float64) - piece.astype(np.float64))
                    raise TraceError(
                        f"{plan.name}: replicated over TP, but {part.where} differs from "
                        f"{plan.parts[0].where} (max |difference| {np.nanmax(diff):.3e} in elements "
                        f"{start}..{start + piece.size - 1}); a sharding rule is missing or the ranks diverged"
                    )
                start += piece.size
        return kept

    def __getitem__(self, key: str) -> Any:
        """The merged tensor as torch (what layout transforms in ``mapping`` take, as every
        tensor store's ``[]``); compares read ``array``, which needs no torch."""
        import numpy as np
        import torch

        return torch.from_numpy(np.array(self.array(key), copy=True))

    def __contains__(self, key: object) -> bool:
        return key in self._plans

    def __iter__(self) -> Iterator[str]:
        return iter(self._plans)

    def __len__(self) -> int:
        return len(self._plans)


def _part_shape(plan: Plan) -> tuple[int, ...]:
    if plan.layout == "replicated":
        return plan.shape
    shape = list(plan.shape)
    shape[plan.dim] //= len(plan.parts)
    return tuple(shape)


def _place(out: np.ndarray, piece: np.ndarray, dim: int, start: int) -> None:
    index = [slice(None)] * out.ndim
    index[dim] = slice(start, start + piece.shape[dim])
    out[tuple(index)] = piece
