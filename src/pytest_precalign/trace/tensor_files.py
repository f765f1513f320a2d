"""Tensor files read as numpy arrays without importing torch: ``torch.save`` files (msprobe's
``dump_tensor_data/*.pt``) and safetensors shards (our traces).

An offline compare is bound by reading and subtracting bytes; importing torch alone costs
about a second, more than comparing a gigabyte. Both formats store raw little-endian bytes
uncompressed, so an array is a read-only view of a memory map: nothing is copied up front,
and the pages are released when the array is dropped. bfloat16 (which numpy lacks) is widened
to float32, exactly.
"""

from __future__ import annotations

import collections
import io
import mmap
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TraceError
from ..untrusted import loads_json, open_regular
from . import pt_zip
from .checksums import Stamps, check_opened

_PT_STORAGES = {
    "FloatStorage": "<f4",
    "DoubleStorage": "<f8",
    "HalfStorage": "<f2",
    "BFloat16Storage": "bf16",
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}
_SAFETENSORS_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "bf16",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}


class Unsupported(Exception):
    """The file is valid but holds more than one plain tensor: the caller falls back to torch."""


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32: the upper half of a float32, exactly."""
    out = raw.astype(np.uint32)
    out <<= 16
    return out.view(np.float32)


def _view(buffer: Any, dtype: str, offset: int, count: int, raw_bf16: bool = False) -> np.ndarray:
    """``count`` elements at byte ``offset`` of ``buffer``; ValueError when it is too short.
    bfloat16 is widened to float32 (a copy), or with ``raw_bf16`` viewed as its uint16 bits."""
    if dtype == "bf16":
        bits = np.frombuffer(buffer, dtype="<u2", count=count, offset=offset)
        return bits if raw_bf16 else bf16_to_float32(bits)
    return np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)


def _map(path: Path, stamps: Stamps | None = None) -> mmap.mmap | bytes:
    """The file mapped read-only (a FIFO or a device is refused before it can block); with
    ``stamps``, only the file its folder's checksums were checked on (``checksums.check_opened``)."""
    with open_regular(path, TraceError, "a tensor file") as f:
        check_opened(path, f.fileno(), stamps)
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            return b""


# -- torch.save ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _StorageType:
    dtype: str


@dataclass(frozen=True)
class _StorageRef:
    dtype: str
    key: str
    numel: int


@dataclass(frozen=True)
class _TensorRef:
    storage: _StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> _TensorRef:
    if not isinstance(storage, _StorageRef):
        raise Unsupported("tensor without a storage")
    return _TensorRef(storage, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride))


class _PtUnpickler(pickle.Unpickler):
    """Knows exactly what ``torch.save(tensor)`` pickles; anything else is Unsupported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _PT_STORAGES:
            return _StorageType(_PT_STORAGES[name])
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise Unsupported(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise Unsupported(f"persistent id {pid!r}")
        kind = pid[1]
        if not isinstance(kind, _StorageType):
            raise Unsupported(f"storage type {kind!r}")
        return _StorageRef(kind.dtype, str(pid[2]), int(pid[4]))


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for dim in reversed(size):
        out.append(step)
        step *= max(dim, 1)
    return tuple(reversed(out))


def read_pt(path: Path, raw_bf16: bool = False, stamps: Stamps | None = None) -> np.ndarray:
    """The tensor a ``torch.save`` file holds, as a read-only numpy view of the mapped file.

    Raises TraceError for a truncated or corrupt file and Unsupported for a valid file this
    reader does not cover (not one plain tensor, compressed or big-endian storage). The zip
    directory is read from the map (``pt_zip``); a file it does not cover goes to ``zipfile``.
    ``raw_bf16``: a bfloat16 tensor as its uint16 bit patterns (not widened); ``stamps``: see
    ``_map``."""
    try:
        data = _map(path, stamps)
    except FileNotFoundError:
        raise TraceError(f"{path}: missing (dump.json names it as data_name)") from None
    except OSError as exc:
        raise TraceError(f"{path}: not a readable torch tensor file (truncated or corrupt?): {exc}") from None
    members = pt_zip.stored_members(data)
    if members is None:
        return _read_pt_zipfile(path, data, raw_bf16)
    pkl = next((n for n in members if n.endswith("/data.pkl") or n == "data.pkl"), None)
    if pkl is None:
        raise Unsupported("no data.pkl (legacy torch.save format)")
    prefix = pkl[: -len("data.pkl")]

    def start_of(name: str) -> int:
        start = pt_zip.data_start(data, members[name])
        if start is None:
            raise TraceError(f"{path}: not a readable torch tensor file (truncated or corrupt?): {name}")
        return start

    def member_bytes(name: str) -> bytes:
        start = start_of(name)
        return bytes(data[start : start + members[name].size])

    if f"{prefix}byteorder" in members and member_bytes(f"{prefix}byteorder") != b"little":
        raise Unsupported("big-endian storage")
    ref = _load_ref(path, io.BytesIO(member_bytes(pkl)))
    storage = f"{prefix}data/{ref.storage.key}"
    if storage not in members:
        raise TraceError(f"{path}: not a readable torch tensor file (storage {ref.storage.key} missing)")
    return _array_at(path, data, ref, start_of(storage), members[storage].size, raw_bf16)


def _read_pt_zipfile(path: Path, data: Any, raw_bf16: bool = False) -> np.ndarray:
    """``read_pt`` through ``zipfile``: for the files ``pt_zip`` does not cover."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: missing (dump.json names it as data_name)") from None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise TraceError(f"{path}: not a readable torch tensor file (truncated or corrupt?): {exc}") from None
    with archive:
        try:
            ref, info = _tensor_ref(path, archive)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:  # a directory pointing past the end
            raise TraceError(
                f"{path}: not a readable torch tensor file (truncated or corrupt?): {exc}"
            ) from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise Unsupported("compressed storage")
    # The local file header (30 bytes + name + extra) precedes the stored bytes.
    header = bytes(data[info.header_offset : info.header_offset + 30])
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise TraceError(f"{path}: not a readable torch tensor file (truncated or corrupt?)")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    return _array_at(path, data, ref, start, info.file_size, raw_bf16)


def _load_ref(path: Path, stream: Any) -> _TensorRef:
    """The pickled tensor reference (``data.pkl``)."""
    try:
        ref = _PtUnpickler(stream).load()
    except Unsupported:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, zipfile.BadZipFile, OSError) as exc:
        raise TraceError(f"{path}: not a readable torch tensor file (truncated or corrupt?): {exc}") from None
    if not isinstance(ref, _TensorRef):
        raise Unsupported(f"holds a {type(ref).__name__}")
    return ref


def _tensor_ref(path: Path, archive: zipfile.ZipFile) -> tuple[_TensorRef, zipfile.ZipInfo]:
    """The pickled tensor reference, and the archive member holding its storage."""
    names = archive.namelist()
    pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
    if pkl is None:
        raise Unsupported("no data.pkl (legacy torch.save format)")
    prefix = pkl[: -len("data.pkl")]
    if f"{prefix}byteorder" in names and archive.read(f"{prefix}byteorder") != b"little":
        raise Unsupported("big-endian storage")
    ref = _load_ref(path, archive.open(pkl))
    try:
        info = archive.getinfo(f"{prefix}data/{ref.storage.key}")
    except KeyError:
        raise TraceError(
            f"{path}: not a readable torch tensor file (storage {ref.storage.key} missing)"
        ) from None
    return ref, info


def _array_at(
    path: Path, data: Any, ref: _TensorRef, start: int, stored: int, raw_bf16: bool = False
) -> np.ndarray:
    """The tensor's elements, viewed in the mapped file where its storage of ``stored`` bytes
    begins at ``start``. A storage shorter than its header says is an error (torch refuses it):
    the bytes after it belong to other members, and would be read as data."""
    itemsize = 2 if ref.storage.dtype == "bf16" else np.dtype(ref.storage.dtype).itemsize
    numel = 1
    for dim in ref.size:
        numel *= dim
    if ref.storage.numel * itemsize != stored:
        raise TraceError(
            f"{path}: not a readable torch tensor file (truncated or corrupt?): its storage holds "
            f"{stored} bytes, its header says {ref.storage.numel * itemsize}"
        )
    try:
        if ref.stride == _contiguous_strides(ref.size) or numel <= 1:
            flat = _view(data, ref.storage.dtype, start + ref.offset * itemsize, numel, raw_bf16)
            return flat.reshape(ref.size)
        whole = _view(data, ref.storage.dtype, start, ref.storage.numel, raw_bf16)
        strided = np.lib.stride_tricks.as_strided(
            whole[ref.offset :],
            shape=ref.size,
            strides=tuple(s * whole.itemsize for s in ref.stride),
            writeable=False,
        )
        return np.ascontiguousarray(strided)
    except ValueError as exc:
        raise TraceError(f"{path}: not a readable torch tensor file (truncated?): {exc}") from None


# -- safetensors -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """A safetensors file read by its JSON header; arrays are views of one memory map."""

    def __init__(self, path: Path, stamps: Stamps | None = None) -> None:
        self.path = path
        self._data = _map(path, stamps)
        head = bytes(self._data[:8])
        if len(head) < 8:
            raise TraceError(f"{path}: not a safetensors file (shorter than its header)")
        (length,) = struct.unpack("<Q", head)
        if length > len(self._data) - 8:
            raise TraceError(f"{path}: not a safetensors file (header runs past the end; truncated?)")
        header = loads_json(
            bytes(self._data[8 : 8 + length]), TraceError, path, bad="not a safetensors file (bad header)"
        )
        if not isinstance(header, dict):
            raise TraceError(f"{path}: not a safetensors file (header is not an object)")
        self._base = 8 + length
        self._entries: dict[str, _Entry] = {}
        for key, item in header.items():
            if key == "__metadata__":
                continue
            try:
                begin, end = (int(x) for x in item["data_offsets"])
                self._entries[key] = _Entry(
                    str(item["dtype"]), tuple(int(d) for d in item["shape"]), begin, end
                )
            except (KeyError, TypeError, ValueError):
                raise TraceError(f"{path}: not a safetensors file (bad header entry {key!r})") from None

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def array(self, key: str, raw_bf16: bool = False) -> np.ndarray:
        entry = self._entries.get(key)
        if entry is None:
            raise TraceError(f"{self.path}: holds no tensor {key!r}")
        dtype = _SAFETENSORS_DTYPES.get(entry.dtype)
        if dtype is None:
            allowed = ", ".join(_SAFETENSORS_DTYPES)
            raise TraceError(f"{self.path}: tensor {key!r} has dtype {entry.dtype!r} (readable: {allowed})")
        numel = 1
        for dim in entry.shape:
            numel *= dim
        itemsize = 2 if dtype == "bf16" else np.dtype(dtype).itemsize
        if entry.end - entry.begin != numel * itemsize:
            raise TraceError(
                f"{self.path}: tensor {key!r}: {entry.end - entry.begin} bytes for shape {list(entry.shape)}"
            )
        try:
            return _view(self._data, dtype, self._base + entry.begin, numel, raw_bf16).reshape(entry.shape)
        except ValueError:
            raise TraceError(
                f"{self.path}: tensor {key!r} runs past the end of the file (truncated?)"
            ) from None
