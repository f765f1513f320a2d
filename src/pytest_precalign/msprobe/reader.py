"""msprobe dumps (dump.json + construct.json [+ dump_tensor_data/]) -> our ``Trace``.

One rank folder becomes one Trace whose records are named like the recorder's, so the
compare and verdict stages run on msprobe dumps unchanged:

* ``Module.<path>.<Class>.forward.<n>``: ``input_args[i]`` -> input ``in.<i>``,
  ``input_kwargs[k]`` -> input ``in.<k>``, ``parameters[p]`` -> input ``param.<p>`` (evidence
  only), ``output`` -> activation ``out`` (one entry) or ``out.<i>`` (nested: ``out.<i>.<j>``,
  ``out.<key>``).
* ``...backward.<n>``: ``input`` (grads w.r.t. the outputs) -> grad_output with the forward
  outputs' slots; ``output`` (grads w.r.t. the inputs) -> grad_input ``in.<i>``.
* ``...parameters_grad.<n>``: ``{"weight": [...]}`` -> param_grad ``<path>.weight``.
* APIs (L1/mix) ``Functional.linear.13.forward`` -> name ``Functional.linear``, call 13,
  module_class ``api``; their enclosing module is in ``manifest["parents"]``.

``Record.seq`` is the order of dump.json's ``data`` (execution order).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from ..errors import TraceError
from ..trace.checksums import folder_identity, recheck, verify_folder
from ..trace.environment import check_environment
from ..trace.records import PHASE_OF_KIND, Record, Stats, Trace, is_dtype_name
from ..trace.trace_notes import TraceNotes
from ..trace.training_record import RunRecord, read_run_record
from ..untrusted import bounded_repr, plain_name, read_json, refuse_link
from ..vocabulary import Kind
from .layout import DUMP_FILE, MANIFEST_SIDECAR, rank_folders, rank_of, single_rank_folder, step_of
from .names import ParsedName, forward_name, parse_name
from .tensors import TENSOR_DIR, PtTensors

CONSTRUCT_FILE = "construct.json"
STACK_FILE = "stack.json"
TASKS = ("statistics", "tensor", "overflow_check")
LEVELS = ("L0", "L1", "mix")
TENSOR_TYPES = ("torch.Tensor", "torch.nn.parameter.Parameter")
_CRC32 = re.compile(r"^[0-9a-fA-F]{8}$")
_XOR = re.compile(r"^0x[0-9a-fA-F]+$")


def read_msprobe_dump(path: str | Path, *, hash_only: bool = False, stack: bool = False) -> Trace:
    """One rank folder (``.../step<N>/rank<N>`` or ``proc<PID>``, the one holding dump.json).

    A step folder or dump root holding exactly one rank folder is accepted too.
    ``hash_only``: drop Max/Min/Mean/Norm where the dump has a CRC-32 (``md5`` mode), so that
    the compare checks bit equality instead of statistics. ``stack``: add the call stacks
    of stack.json to the manifest (``name#call`` -> frames).
    """
    folder = single_rank_folder(path)
    return _read_rank(folder, step_of(folder.parent) or 0, rank_of(folder) or 0, hash_only, stack)


def read_msprobe_set(
    path: str | Path, *, hash_only: bool = False, stack: bool = False
) -> dict[tuple[int, int], Trace]:
    """Every rank folder under a dump root, a step folder or a rank folder: (step, rank) ->
    Trace; rank 0 for ``proc<PID>`` folders."""
    found = rank_folders(path)
    return {key: _read_rank(found[key], key[0], key[1], hash_only, stack) for key in sorted(found)}


# -- one rank folder -----------------------------------------------------------------------


def _read_rank(folder: Path, step: int, rank: int, hash_only: bool, stack: bool) -> Trace:
    identity = folder_identity(folder)
    stamps = verify_folder(folder)  # the checksums our writer left (msprobe's own dumps have none)
    dump_file = folder / DUMP_FILE
    dump = _load_json(dump_file)
    if not isinstance(dump, dict) or not isinstance(dump.get("data"), dict):
        raise TraceError(
            f"{dump_file}: not an msprobe dump.json: expected an object with 'data' (record name -> record)"
        )
    task, level, framework = _header(dump, dump_file)
    construct = _read_construct(folder / CONSTRUCT_FILE, level)
    tensor_dir = folder / TENSOR_DIR  # beside dump.json: its dump_data_dir may be null or stale
    if task == "tensor" and not tensor_dir.is_dir():
        raise TraceError(f"{tensor_dir}: missing; a task 'tensor' dump keeps its tensors there")
    build = _Builder(dump_file, step, hash_only)
    for raw, body in dump["data"].items():
        build.add(str(raw), body)
    records = _with_deps(build.records)
    stats_seen = any(r.stats is not None for r in records)
    hashes = [r.crc32 for r in records if r.crc32 is not None]
    manifest: dict[str, Any] = {
        "format": "msprobe",
        "task": task,
        "level": level,
        "framework": framework,
        "record_mode": _record_mode(task, stats_seen, bool(hashes)),
        "summary_mode": _summary_mode(task, hashes),
        "step": step,
        "rank": rank,
        "path": str(folder),
        "parents": _parents(dump["data"], construct),
        "skipped_non_tensor": build.skipped,
    }
    if stack:
        manifest["stack"] = _read_stack(folder / STACK_FILE, dump["data"])
    kept, run = _kept_manifest(folder)
    manifest = {**kept, **manifest}
    tensors: Mapping[str, Any] = {}
    if build.shapes:
        tensors = PtTensors(tensor_dir, build.shapes, stamps)
    notes = TraceNotes.from_manifest(manifest, str(folder / (MANIFEST_SIDECAR if kept else DUMP_FILE)))
    recheck(folder, {folder: identity})  # one version read, or refused
    return Trace(manifest=manifest, records=tuple(records), tensors=tensors, run=run, given_notes=notes)


def _kept_manifest(folder: Path) -> tuple[dict[str, Any], RunRecord]:
    """The manifest our ``Recorder`` kept beside dump.json (``MANIFEST_SIDECAR``: the step's
    scalars, the run's settings, the rank's parallel block); {} for msprobe's own dumps.
    What dump.json itself says (the records' mode, step, rank) wins over it."""
    file = folder / MANIFEST_SIDECAR
    if not file.is_file():
        return {}, RunRecord()
    data = read_json(file, TraceError, what="the Recorder's manifest kept beside dump.json")
    if not isinstance(data, dict):
        raise TraceError(f"{file}: expected a JSON object (the Recorder's trace manifest)")
    check_environment(data, file)
    return data, read_run_record(data, str(file))  # its run record typed here, naming the file


def _header(dump: Mapping[str, Any], dump_file: Path) -> tuple[str, str, str]:
    task, level = dump.get("task"), dump.get("level")
    framework = dump.get("framework") or "pytorch"  # older msprobe versions leave it out
    if task not in TASKS:
        raise TraceError(
            f"{dump_file}: task {bounded_repr(task)} is not readable (expected one of {', '.join(TASKS)})"
        )
    if level not in LEVELS:
        raise TraceError(
            f"{dump_file}: level {bounded_repr(level)} is not readable (expected one of {', '.join(LEVELS)})"
        )
    if framework != "pytorch":
        raise TraceError(
            f"{dump_file}: framework {bounded_repr(framework)} is not supported (expected pytorch)"
        )
    return str(task), str(level), str(framework)


def _read_construct(file: Path, level: str) -> dict[str, str | None]:
    """The forward module tree; L1 dumps have none (their construct.json is ``{}``)."""
    if level == "L1" and not file.exists():
        return {}
    data = _load_json(file, why=f"level {level} dumps need it for the module tree")
    if not isinstance(data, dict) or not all(v is None or isinstance(v, str) for v in data.values()):
        raise TraceError(f"{file}: expected an object mapping record names to parent names (or null)")
    if not data and level != "L1":
        raise TraceError(f"{file}: empty, but a level {level} dump records its module tree there")
    return data


def _record_mode(task: str, stats_seen: bool, hashes_seen: bool) -> str:
    if task == "tensor":
        return "tensor"
    return "hash" if hashes_seen and not stats_seen else "stats"


def _summary_mode(task: str, hashes: list[str]) -> str:
    if task == "tensor":
        return "tensor"
    if any(h.startswith("xor:") for h in hashes):
        return "xor"
    return "md5" if hashes else "statistics"


def _load_json(file: Path, why: str = "") -> Any:
    """A dump folder's JSON file (size, first bytes and regular file checked before reading;
    dump.json may hold a record name only once)."""
    refuse_link(file, TraceError, "a dump folder")
    return read_json(file, TraceError, why=why)


# -- records ---------------------------------------------------------------------------------


@dataclass
class _Builder:
    """Turns dump.json records into ``Record`` s, in the order they come."""

    dump_file: Path
    step: int
    hash_only: bool
    records: list[Record] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # data_name -> shape
    skipped: int = 0  # non-tensor values (ints, bools, strings, ...)
    _ids: set[str] = field(default_factory=set)
    _out_slots: dict[tuple[str, int], list[str]] = field(default_factory=dict)

    def add(self, raw: str, body: Any) -> None:
        try:
            parsed = parse_name(raw)
        except TraceError as exc:
            raise TraceError(f"{self.dump_file}: {exc}") from None
        if not isinstance(body, dict):
            self._bad(raw, "", f"expected an object, got {type(body).__name__}")
        if parsed.direction == "forward":
            self._forward(raw, parsed, body)
        elif parsed.direction == "backward":
            self._backward(raw, parsed, body)
        else:
            self._param_grads(raw, parsed, body)

    def _forward(self, raw: str, p: ParsedName, body: Mapping[str, Any]) -> None:
        for i, arg in enumerate(self._field(raw, body, "input_args", list)):
            self._emit(raw, p, "input", self._walk(raw, arg, f"in.{i}"))
        for key, arg in self._field(raw, body, "input_kwargs", dict).items():
            self._emit(raw, p, "input", self._walk(raw, arg, f"in.{key}"))
        for key, param in self._field(raw, body, "parameters", dict).items():
            self._emit(raw, p, "input", self._walk(raw, param, f"param.{key}"))
        outputs = list(self._walk_outputs(raw, self._field(raw, body, "output", list)))
        self._out_slots[(p.name, p.call)] = [slot for slot, _ in outputs]
        self._emit(raw, p, "activation", iter(outputs))

    def _backward(self, raw: str, p: ParsedName, body: Mapping[str, Any]) -> None:
        grads = list(self._walk_outputs(raw, self._field(raw, body, "input", list)))
        fwd_slots = self._out_slots.get((p.name, p.call))
        if fwd_slots is not None and len(fwd_slots) == len(grads):
            # One grad per tensor output: name it like the output it belongs to (msprobe
            # drops the None entries a forward output list may hold, e.g. attention weights).
            grads = [(slot, entry) for slot, (_, entry) in zip(fwd_slots, grads, strict=True)]
        self._emit(raw, p, "grad_output", iter(grads))
        for i, grad in enumerate(self._field(raw, body, "output", list)):
            self._emit(raw, p, "grad_input", self._walk(raw, grad, f"in.{i}"))

    def _param_grads(self, raw: str, p: ParsedName, body: Mapping[str, Any]) -> None:
        for pname, grads in body.items():
            items = grads if isinstance(grads, list) else [grads]
            name = f"{p.name}.{pname}"
            for i, grad in enumerate(items):
                slot = "" if len(items) == 1 else str(i)
                target = ParsedName(name, p.module_class, p.direction, p.call, p.is_module)
                self._emit(raw, target, "param_grad", self._walk(raw, grad, slot))

    def _walk_outputs(self, raw: str, outputs: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        if len(outputs) == 1:
            yield from self._walk(raw, outputs[0], "out")
        else:
            for i, out in enumerate(outputs):
                yield from self._walk(raw, out, f"out.{i}")

    def _walk(self, raw: str, value: Any, slot: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(slot, tensor entry) pairs of a nested value; None is an absent value."""
        if value is None:
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                yield from self._walk(raw, item, f"{slot}.{i}" if slot else str(i))
        elif isinstance(value, dict) and "type" in value:
            if value["type"] in TENSOR_TYPES:
                yield slot, value
            else:
                self.skipped += 1
        elif isinstance(value, dict):  # a mapping output (ModelOutput): one entry per key
            for key, item in value.items():
                yield from self._walk(raw, item, f"{slot}.{key}" if slot else str(key))
        else:
            self._bad(raw, slot, f"expected a tensor entry, a list or an object, got {bounded_repr(value)}")

    def _emit(
        self, raw: str, p: ParsedName, kind: Kind, entries: Iterator[tuple[str, dict[str, Any]]]
    ) -> None:
        for slot, entry in entries:
            dtype, shape, stats, crc, data_name = self._tensor(raw, slot, entry)
            record = Record(
                seq=len(self.records),
                name=p.name,
                module_class=p.module_class,
                phase=PHASE_OF_KIND[kind],
                step=self.step,
                call=p.call,
                kind=kind,
                slot=slot,
                dtype=dtype,
                shape=shape,
                stats=stats,
                crc32=crc,
                tensor_key=data_name,
            )
            if record.id in self._ids:
                self._bad(raw, slot, f"a second {kind} record {record.id!r}")
            self._ids.add(record.id)
            if data_name is not None:
                self.shapes[data_name] = shape
            self.records.append(record)

    def _tensor(
        self, raw: str, slot: str, entry: Mapping[str, Any]
    ) -> tuple[str, tuple[int, ...], Stats | None, str | None, str | None]:
        dtype, shape = entry.get("dtype"), entry.get("shape")
        if not isinstance(dtype, str):
            self._bad(raw, slot, "tensor entry without a 'dtype' string")
        if not is_dtype_name(dtype.removeprefix("torch.")):
            self._bad(
                raw,
                slot,
                f"dtype {bounded_repr(dtype)} is not a torch dtype (e.g. torch.float32, torch.bfloat16)",
            )
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            self._bad(raw, slot, "tensor entry without a 'shape' list of ints")
        crc = _hash(entry.get("md5"))
        stats = None if (self.hash_only and crc is not None) else _stats(entry)
        data_name = entry.get("data_name")
        if data_name is not None and not isinstance(data_name, str):
            self._bad(raw, slot, f"'data_name' must be a file name, got {bounded_repr(data_name)}")
        if data_name is not None:
            where = f"{self.dump_file}: record {bounded_repr(raw)} {slot}: data_name"
            plain_name(data_name, self.dump_file.parent / TENSOR_DIR, where, TraceError)
        return dtype.removeprefix("torch."), tuple(shape), stats, crc, data_name

    def _field(self, raw: str, body: Mapping[str, Any], key: str, kind: type) -> Any:
        value = body.get(key)
        if value is None:
            return kind()
        if not isinstance(value, kind):
            self._bad(raw, key, f"expected a {kind.__name__}, got {type(value).__name__}")
        return value

    def _bad(self, raw: str, where: str, what: str) -> NoReturn:
        at = f" {where}" if where else ""
        raise TraceError(f"{self.dump_file}: record {bounded_repr(raw)}{at}: {what}")


def _stats(entry: Mapping[str, Any]) -> Stats | None:
    """Max/Min/Mean/Norm (null -> nan: integer tensors have no Mean/Norm); None in xor mode."""
    keys = ("Max", "Min", "Mean", "Norm")
    if not any(k in entry for k in keys):
        return None
    vmax, vmin, mean, norm = (_number(entry.get(k)) for k in keys)
    # msprobe keeps no nan/inf counts; a NaN or infinite extreme shows there is at least one.
    nan = int(any(math.isnan(v) and entry.get(k) is not None for k, v in (("Max", vmax), ("Min", vmin))))
    inf = int(vmax == math.inf) + int(vmin == -math.inf)
    return Stats(vmax, vmin, mean, norm, nan, inf)


def _number(value: Any) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)  # numbers, bools, and "inf"/"nan" strings
    except (TypeError, ValueError):
        return math.nan


def _hash(value: Any) -> str | None:
    """msprobe's ``md5`` is a CRC-32 (8 hex digits) or, in xor mode, ``0x`` + 16 hex digits;
    the prefixes keep the kinds apart so a CRC is never compared with anything else."""
    if value is None:
        return None
    text = str(value)
    if _CRC32.match(text):
        return text.lower()
    if _XOR.match(text):
        return f"xor:{text.lower()}"
    return f"md5:{text.lower()}"


def _with_deps(records: list[Record]) -> list[Record]:
    """Deps like the recorder's: outputs <- the call's inputs, grads w.r.t. inputs <- grads
    w.r.t. outputs, param grads <- the owner's grads w.r.t. outputs and inputs.

    Parameters are not deps of the outputs: a module's own weights are part of its code, so a
    perturbed weight makes the module the origin (as in the recorder)."""
    inputs: dict[tuple[str, int], list[str]] = {}
    grad_outputs: dict[tuple[str, int], list[str]] = {}
    by_owner: dict[str, list[str]] = {}
    for r in records:
        if r.kind == "input" and not r.slot.startswith("param."):
            inputs.setdefault((r.name, r.call), []).append(r.id)
            by_owner.setdefault(r.name, []).append(r.id)
        elif r.kind == "grad_output":
            grad_outputs.setdefault((r.name, r.call), []).append(r.id)
            by_owner.setdefault(r.name, []).append(r.id)
    out = []
    for r in records:
        deps: list[str] = []
        if r.kind == "activation":
            deps = inputs.get((r.name, r.call), [])
        elif r.kind == "grad_input":
            deps = grad_outputs.get((r.name, r.call), [])
        elif r.kind == "param_grad":
            deps = by_owner.get(r.name.rpartition(".")[0], [])
        out.append(replace(r, deps=tuple(deps)) if deps else r)
    return out


# -- manifest extras --------------------------------------------------------------------------


def _parents(data: Mapping[str, Any], construct: Mapping[str, str | None]) -> dict[str, str]:
    """``name#call`` -> the parent's ``name#call`` ("" at the top), from the forward tree:
    msprobe's own parents of backward records are sometimes null or wrong."""
    parents: dict[str, str] = {}
    for raw in data:
        p = parse_name(raw)
        if p.direction == "parameters_grad" or p.key in parents:
            continue
        fwd = forward_name(raw)
        parent = construct[fwd] if fwd in construct else construct.get(raw)
        parents[p.key] = _key_of(parent) if parent else ""
    return parents


def _key_of(raw: str) -> str:
    try:
        return parse_name(raw).key
    except TraceError:
        return raw  # not a record name: keep msprobe's text rather than lose the link


def _read_stack(file: Path, data: Mapping[str, Any]) -> dict[str, list[str]]:
    """``name#call`` -> frames, from stack.json's ``{"0": [[names...], [frames...]]}``."""
    if not file.exists():
        return {}
    groups = _load_json(file)
    if not isinstance(groups, dict):
        raise TraceError(f"{file}: expected an object of [[names], [frames]] groups")
    out: dict[str, list[str]] = {}
    for gid, group in groups.items():
        if not (isinstance(group, list) and len(group) == 2 and all(isinstance(g, list) for g in group)):
            raise TraceError(f"{file}: group {bounded_repr(gid)}: expected [[names...], [frames...]]")
        names, frames = group
        for raw in names:
            if raw in data:
                out.setdefault(parse_name(raw).key, [str(f) for f in frames])
    return out
