"""Traces on disk: ``manifest.json``, ``index.json`` (records in execution order) and tensors
in safetensors shards. The only module that reads or writes trace directories.

Writes are atomic: everything goes to a temporary sibling directory that is renamed into
place, and an existing trace is never replaced unless the caller says ``overwrite=True``
(then the old one is moved aside first and removed only after the new one is in place).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .._atomic import share_file, temp_dir_beside
from ..errors import TraceError
from ..redaction import redacted
from ..untrusted import bounded_repr, check_regular, open_regular, read_json, refuse_link
from .checksums import Checksums, Stamps, check_opened, file_sha256, folder_identity, recheck, verify_folder
from .environment import check_environment
from .records import PHASE_OF_KIND, Record, Trace, is_dtype_name, record_from_dict
from .trace_notes import TraceNotes
from .training_record import read_run_record

FORMAT = "pytest-precalign-trace"
FORMAT_VERSION = 1
SHARD_BYTES = 1 << 30  # 1 GiB per safetensors file


def write_trace(trace: Trace, path: str | Path, *, overwrite: bool = False) -> Path:
    target = Path(path)
    if target.exists() and not overwrite:
        raise TraceError(f"{target}: a trace already exists there; refusing to overwrite it")
    return finish_trace(trace, begin_trace(target), target, overwrite=overwrite)


def begin_trace(target: Path) -> Path:
    """The temporary folder a trace of ``target`` is written into (``.NAME.HOST.PID.*.tmp``
    beside it, which readers ignore); temporary folders that writers on this host which are no
    longer running (killed mid-write) left beside ``target`` are removed first."""
    host = socket.gethostname().replace("/", "_")
    prefix = f".{target.name}.{host}."
    if target.parent.is_dir():
        for stale in target.parent.glob(f"{glob.escape(prefix)}*.tmp"):
            pid = stale.name[len(prefix) :].split(".")[0]
            if pid.isdigit() and not _running(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
    return temp_dir_beside(target, prefix=f"{prefix}{os.getpid()}.")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def finish_trace(
    trace: Trace,
    tmp: Path,
    target: Path,
    *,
    shards: Mapping[str, str] | None = None,
    digests: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the rest of a trace into ``tmp`` (``shards``: tensors already there, written by a
    background writer, ``digests``: their files' sha256) and publish it as ``target``, sealed
    by its checksums (``trace.checksums``); ``tmp`` is removed on any failure."""
    try:
        if target.exists() and not overwrite:
            raise TraceError(f"{target}: a trace already exists there; refusing to overwrite it")
        sums = write_trace_files(trace, tmp, shards=shards)
        sums.update(digests or {})
        sums.publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def shard_name(number: int) -> str:
    return f"tensors-{number:05d}.safetensors"


def write_shard(tensors: Mapping[str, Any], path: Path) -> str:
    """One safetensors shard of contiguous tensors, with the umask's permissions; its sha256
    (hashed once, right after safetensors wrote it, while it is in the page cache)."""
    from safetensors.torch import save_file

    save_file(dict(tensors), str(path))
    share_file(path)
    return file_sha256(path)


def write_trace_files(trace: Trace, folder: Path, *, shards: Mapping[str, str] | None = None) -> Checksums:
    """Write a trace's files into an existing (temporary) folder; the caller seals (the
    checksums returned, last) and publishes it. ``shards``: tensors already written into
    ``folder`` (key -> file); the others are written."""
    tmp = folder
    sums = Checksums()
    shards = dict(shards or {})
    batch: dict[str, Any] = {}
    size = 0
    shard_no = len(set(shards.values()))

    def flush() -> None:
        nonlocal batch, size, shard_no
        if not batch:
            return
        file = shard_name(shard_no)
        sums.files[file] = write_shard(batch, tmp / file)
        for key in batch:
            shards[key] = file
        batch, size, shard_no = {}, 0, shard_no + 1

    for key in sorted(k for k in trace.tensors if k not in shards):
        tensor = trace.tensors[key].contiguous()
        batch[key] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= SHARD_BYTES:
            flush()
    flush()
    # Ours last: a trace read from elsewhere (e.g. msprobe) keeps where it came from. Every
    # value from the user's arguments, configs, environment and paths: no secret (redaction).
    manifest = {
        **redacted(dict(trace.manifest)),
        "source_format": trace.manifest.get("format", FORMAT),
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
    }
    sums.write_json(tmp, "manifest.json", manifest)
    index = _index_text([r.as_dict() for r in trace.records], shards)
    sums.write(tmp, "index.json", index.encode("utf-8"))
    return sums


def _index_text(records: list[dict[str, Any]], shards: dict[str, str]) -> str:
    """``index.json``'s text, one record a line: each line by json's C encoder (``indent=``
    takes its Python one, ~4x the CPU time for a step's records: a recorded step writes one)."""
    lines = ",\n".join(json.dumps(r, default=str) for r in records)
    return f'{{"records": [\n{lines}\n], "shards": {json.dumps(shards)}}}\n'


class _ShardedTensors(Mapping[str, Any]):
    """Lazy key -> tensor view over the safetensors shards of a trace directory."""

    def __init__(
        self,
        root: Path,
        shards: Mapping[str, str],
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        stamps: Stamps | None = None,
    ) -> None:
        self._root = root
        self._stamps = stamps  # what its checksums were checked on: a shard loaded is that file
        self._shards = dict(shards)
        self._shapes = dict(shapes or {})  # key -> the shape index.json gives, checked on load
        self._open: dict[str, Any] = {}
        self._arrays: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        from safetensors import SafetensorError, safe_open

        file = self._shards[key]
        try:
            handle = self._open.get(file)
            if handle is None:
                handle = self._open[file] = self._safe_open(self._root / file, safe_open)
            tensor = handle.get_tensor(key)
        except FileNotFoundError:
            raise TraceError(f"{self._root}: index.json names {file}, which is missing") from None
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise TraceError(f"{self._root / file}: cannot read tensor {key!r}: {exc}") from None
        return self._checked(key, self._root / file, tensor)

    def _safe_open(self, path: Path, safe_open: Any) -> Any:
        """safetensors' reader on the file that was checked: opened here, its descriptor checked
        against the checksums' stamps, and safetensors given that very descriptor's file."""
        refuse_link(path, TraceError, "a trace folder")
        check_regular(path, TraceError, "a safetensors shard")
        with open_regular(path, TraceError, "a safetensors shard") as f:
            check_opened(path, f.fileno(), self._stamps)
            opened = Path(f"/proc/self/fd/{f.fileno()}")
            return safe_open(str(opened if opened.exists() else path), framework="pt")

    raw_bf16_arrays = True  # ``array(key, raw_bf16=True)``: see ``Trace.raw_array``

    def array(self, key: str, raw_bf16: bool = False) -> Any:
        """The tensor as a numpy view of the mapped shard, without torch (``raw_bf16``: a
        bfloat16 tensor as its uint16 bits)."""
        from .tensor_files import SafetensorsFile

        file = self._shards[key]
        path = self._root / file
        try:
            reader = self._arrays.get(file)
            if reader is None:
                refuse_link(path, TraceError, "a trace folder")
                if not path.is_file():
                    raise TraceError(f"{self._root}: index.json names {file}, which is missing")
                reader = self._arrays[file] = SafetensorsFile(path, self._stamps)
            array = reader.array(key, raw_bf16)
        except TraceError as exc:
            if not str(exc).startswith(f"{path}: "):
                raise
            reason = str(exc)[len(f"{path}: ") :]
            raise TraceError(f"{path}: cannot read tensor {key!r}: {reason}") from None
        return self._checked(key, path, array)

    def _checked(self, key: str, path: Path, value: Any) -> Any:
        """``value`` (a tensor or an array) when its shape is the one index.json gives."""
        expected = self._shapes.get(key)
        if expected is not None and tuple(value.shape) != expected:
            raise TraceError(
                f"{path}: tensor {key!r} holds a tensor of shape {list(value.shape)}, "
                f"index.json says {list(expected)}"
            )
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._shards

    def __iter__(self) -> Iterator[str]:
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)


def read_trace(path: str | Path) -> Trace:
    root = Path(path)
    if not root.is_dir():
        raise TraceError(f"{root}: no trace directory there")
    identity = folder_identity(root)
    stamps = verify_folder(root)  # its checksums (when it has them) before any file is trusted
    manifest = _read_json(root / "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise TraceError(f"{root / 'manifest.json'}: not a pytest-precalign trace manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise TraceError(
            f"{root / 'manifest.json'}: format_version {bounded_repr(manifest.get('format_version'))} "
            f"is not supported (expected {FORMAT_VERSION})"
        )
    check_environment(manifest, root / "manifest.json")
    where = str(root / "manifest.json")  # its run record and notes typed here, naming the file
    run, notes = read_run_record(manifest, where), TraceNotes.from_manifest(manifest, where)
    index = _read_json(root / "index.json")
    if not isinstance(index, dict) or not isinstance(index.get("records"), list):
        raise TraceError(f"{root / 'index.json'}: expected {{'records': [...], 'shards': {{...}}}}")
    records: list[Record] = []
    seen: set[str] = set()
    for i, item in enumerate(index["records"]):
        record = _record(item, f"{root / 'index.json'}: records[{i}]")
        if record.id in seen:
            raise TraceError(f"{root / 'index.json'}: records[{i}]: duplicate record id {record.id!r}")
        seen.add(record.id)
        records.append(record)
    shards = index.get("shards") or {}
    if not isinstance(shards, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v and Path(v).name == v for k, v in shards.items()
    ):
        raise TraceError(
            f"{root / 'index.json'}: 'shards' must map tensor keys to file names in the trace directory"
        )
    for r in records:
        if r.tensor_key is not None and r.tensor_key not in shards:
            raise TraceError(
                f"{root / 'index.json'}: record {r.id!r} points at tensor {r.tensor_key!r}, "
                "which no shard holds"
            )
    shapes = {r.tensor_key: r.shape for r in records if r.tensor_key is not None}
    tensors = _ShardedTensors(root, shards, shapes, stamps)
    recheck(root, {root: identity})  # one version read, or refused
    return Trace(manifest=manifest, records=tuple(records), tensors=tensors, run=run, given_notes=notes)


_STATS_KEYS = ("max", "min", "mean", "norm", "nan", "inf")
_RECORD_KEYS = ("seq", "name", "module_class", "phase", "step", "call", "kind", "slot", "dtype", "shape")


def _record(item: Any, where: str) -> Record:
    """One index.json record, checked: a wrong one is named with what is allowed."""
    if not isinstance(item, dict):
        raise TraceError(f"{where}: expected an object, got {type(item).__name__}")
    missing = [k for k in _RECORD_KEYS if k not in item]
    if missing:
        raise TraceError(
            f"{where}: missing key {bounded_repr(missing[0])} (a record has {', '.join(_RECORD_KEYS)})"
        )
    for key in ("name", "module_class", "phase", "kind", "slot", "dtype"):
        if not isinstance(item[key], str):
            raise TraceError(f"{where}: {key} must be a string, got {bounded_repr(item[key])}")
    for key in ("tensor_key", "crc32"):
        if not isinstance(item.get(key), (str, type(None))):
            raise TraceError(f"{where}: {key} must be a string or null, got {bounded_repr(item[key])}")
    deps = item.get("deps", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise TraceError(f"{where}: deps must be a list of record ids, got {bounded_repr(deps)}")
    stats = item.get("stats")
    if stats is not None and not (
        isinstance(stats, dict)
        and set(_STATS_KEYS[:4]) <= set(stats) <= set(_STATS_KEYS)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in stats.values())
    ):
        raise TraceError(
            f"{where}: stats must be null or numbers {', '.join(_STATS_KEYS)}, got {bounded_repr(stats)}"
        )
    if item["kind"] not in PHASE_OF_KIND:
        raise TraceError(
            f"{where}: kind {bounded_repr(item['kind'])} is unknown (allowed: {', '.join(PHASE_OF_KIND)})"
        )
    if not is_dtype_name(item["dtype"]):
        raise TraceError(
            f"{where}: dtype {bounded_repr(item['dtype'])} is not a torch dtype name (e.g. float32, bfloat16, int64)"
        )
    shape = item["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise TraceError(f"{where}: shape must be a list of integers >= 0, got {bounded_repr(shape)}")
    for key in ("seq", "step", "call"):
        if not isinstance(item[key], int) or isinstance(item[key], bool):
            raise TraceError(f"{where}: {key} must be an integer, got {bounded_repr(item[key])}")
    try:
        return record_from_dict(item)
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{where}: malformed: {type(exc).__name__}: {exc}") from None


def _read_json(path: Path) -> Any:
    refuse_link(path, TraceError, "a trace folder")
    return read_json(path, TraceError, bad="cannot read")
