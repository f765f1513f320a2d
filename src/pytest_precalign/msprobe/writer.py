"""Write a trace as an msprobe dump (``dump.json``, ``construct.json``, ``stack.json`` and, in
tensor mode, ``dump_tensor_data/*.pt``), so msprobe's own tools (compare, graph) accept it.

Module records become msprobe's L0 names, ``Module.<path>.<Class>.forward.<call>`` with
``input_args``/``input_kwargs``/``output``, ``...backward.<call>`` with ``input`` (grads
w.r.t. the outputs) and ``output`` (grads w.r.t. the inputs), and
``...parameters_grad`` with one entry per parameter. Op records (record level op/mix) become
msprobe's API names, ``Functional.softmax.<n>.forward`` / ``.backward`` with n counting that
api's calls through the step (as msprobe's counters do), under the level ``L1`` (ops only) or
``mix``; construct.json links each to its module. The folder is written atomically.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..redaction import redacted
from ..trace.checksums import Checksums
from ..trace.op_names import API_CLASS, PER_MODULE_CALL, split_op_name
from ..trace.records import Record, Trace
from .layout import MANIFEST_SIDECAR

TASKS = {"tensor": "tensor", "stats": "statistics", "hash": "statistics"}
_SKIP = ("logits", "loss", "param")  # msprobe has no such records; they stay in our trace


def _slot_index(slot: str) -> tuple[str, str]:
    """("in", "0") / ("in", "hidden_states") / ("out", "0") for our slot names."""
    head, _, rest = slot.partition(".")
    return head, rest or "0"


def _entry(record: Record, data_name: str | None) -> dict[str, Any]:
    stats = record.stats
    entry: dict[str, Any] = {
        "type": "torch.Tensor",
        "dtype": f"torch.{record.dtype}",
        "shape": list(record.shape),
        "Max": stats.max if stats else None,
        "Min": stats.min if stats else None,
        "Mean": stats.mean if stats else None,
        "Norm": stats.norm if stats else None,
        "requires_grad": record.kind != "input",
    }
    if record.crc32 is not None and not record.crc32.startswith("xor:"):
        entry["md5"] = record.crc32
    if data_name is not None:
        entry["data_name"] = data_name
    return entry


def _module_key(record: Record, direction: str) -> str:
    return f"Module.{record.name}.{record.module_class}.{direction}.{record.call}"


def build_dump(trace: Trace, step: int = 0) -> tuple[dict[str, Any], dict[str, Any], dict[str, Record]]:
    """dump.json's and construct.json's contents, and the .pt files to write (name -> record)."""
    tensor_mode = trace.mode == "tensor"
    data: dict[str, dict[str, Any]] = {}
    files: dict[str, Record] = {}
    done_at: dict[str, int] = {}
    apis = _ApiCounters()
    for rec in trace.records:
        if rec.step != step or rec.kind in _SKIP:
            continue
        if rec.module_class == API_CLASS:
            key, data_name = _add_api(data, rec, apis, tensor_mode)
        elif rec.kind == "param_grad":
            key, data_name = _add_param_grad(data, rec, tensor_mode)
        else:
            key, data_name = _add_module(data, rec, tensor_mode)
        if tensor_mode and data_name is not None:
            files[data_name] = rec
        done_at[key] = rec.seq
    # msprobe writes a record when its hook completes (a module's outputs after its children's):
    # order the keys by their last record, so execution order survives the round trip.
    data = {key: data[key] for key in sorted(data, key=lambda k: done_at[k])}
    modules = any(key.startswith("Module.") for key in data)
    level = ("mix" if modules else "L1") if apis.parent else "L0"
    construct = _construct(data, apis.parent) if level != "L1" else {}
    return (
        {
            "task": TASKS.get(trace.mode, "statistics"),
            "level": level,
            "framework": "pytorch",
            "dump_data_dir": None,
            "data": data,
        },
        construct,
        files,
    )


@dataclass
class _ApiCounters:
    """msprobe numbers each API's calls: (record name, call) -> its counter; and each API
    key's parent module (module path, module call)."""

    index: dict[tuple[str, int], int] = dataclass_field(default_factory=dict)
    count: dict[str, int] = dataclass_field(default_factory=dict)
    parent: dict[str, tuple[str, int]] = dataclass_field(default_factory=dict)


def _add_api(
    data: dict[str, dict[str, Any]], rec: Record, apis: _ApiCounters, tensor_mode: bool
) -> tuple[str, str | None]:
    module, api = split_op_name(rec.name)
    n = apis.index.get((rec.name, rec.call))
    if n is None:
        n = apis.index[(rec.name, rec.call)] = apis.count.get(api, 0)
        apis.count[api] = n + 1
    forward = rec.kind == "activation"
    key = f"{api}.{n}.{'forward' if forward else 'backward'}"
    apis.parent[key] = (module, rec.call // PER_MODULE_CALL)
    body = data.setdefault(
        key,
        {"input_args": [], "input_kwargs": {}, "output": []} if forward else {"input": [], "output": []},
    )
    field = "output" if forward else "input"
    data_name = f"{key}.{field}.{len(body[field])}.pt" if tensor_mode else None
    body[field].append(_entry(rec, data_name))
    return key, data_name


def _add_param_grad(
    data: dict[str, dict[str, Any]], rec: Record, tensor_mode: bool
) -> tuple[str, str | None]:
    owner, _, pname = rec.name.rpartition(".")
    key = f"Module.{owner}.{rec.module_class}.parameters_grad.{rec.call}"
    data.setdefault(key, {}).setdefault(pname, [])
    data_name = f"{key}.{pname}.{len(data[key][pname])}.pt" if tensor_mode else None
    data[key][pname].append(_entry(rec, data_name))
    return key, data_name


def _add_module(data: dict[str, dict[str, Any]], rec: Record, tensor_mode: bool) -> tuple[str, str | None]:
    direction = "forward" if rec.kind in ("activation", "input") else "backward"
    key = _module_key(rec, direction)
    record = data.setdefault(
        key,
        {"input_args": [], "input_kwargs": {}, "output": [], "parameters": {}}
        if direction == "forward"
        else {"input": [], "output": []},
    )
    index = _slot_index(rec.slot)[1]
    position: int | str
    if rec.kind == "activation":
        field, position = "output", len(record["output"])
    elif rec.kind == "input":
        field = "input_args" if index.isdigit() else "input_kwargs"
        position = len(record["input_args"]) if index.isdigit() else index
    elif rec.kind == "grad_output":
        field, position = "input", len(record["input"])
    else:
        field, position = "output", len(record["output"])
    data_name = f"{key}.{field}.{position}.pt" if tensor_mode else None
    entry = _entry(rec, data_name)
    if isinstance(position, str):
        record[field][position] = entry
    else:
        record[field].append(entry)
    return key, data_name


def _parse_key(key: str) -> tuple[str, str]:
    """(module path, direction) of an msprobe module record name."""
    parts = key.split(".")
    return ".".join(parts[1:-3]), parts[-2]


def _construct(data: Mapping[str, Any], api_parent: Mapping[str, tuple[str, int]]) -> dict[str, str | None]:
    """Each record's parent: the same direction's record of the nearest recorded ancestor (for
    an API call: of the module it ran in)."""
    first: dict[tuple[str, str], str] = {}
    calls: dict[tuple[str, str, int], str] = {}
    for key in data:
        if key not in api_parent:
            first.setdefault(_parse_key(key), key)
            calls[(*_parse_key(key), int(key.rpartition(".")[2]))] = key
    out: dict[str, str | None] = {}
    for key in data:
        if key in api_parent:
            module, call = api_parent[key]
            direction = key.rpartition(".")[2]
            out[key] = calls.get((module, direction, call)) or _enclosing(first, module, direction)
            continue
        path, direction = _parse_key(key)
        look = "forward" if direction == "parameters_grad" else direction
        parent = None
        ancestor = path if direction == "parameters_grad" else path.rpartition(".")[0]
        while ancestor and parent is None:
            parent = first.get((ancestor, look))
            ancestor = ancestor.rpartition(".")[0] if parent is None else ancestor
        out[key] = parent
    return out


def _enclosing(first: Mapping[tuple[str, str], str], path: str, direction: str) -> str | None:
    """The nearest recorded module at or above ``path`` (an op inside an excluded module)."""
    while path:
        if (path, direction) in first:
            return first[(path, direction)]
        path = path.rpartition(".")[0]
    return None


def write_msprobe_dump(
    trace: Trace,
    path: str | Path,
    *,
    step: int = 0,
    rank: int = 0,
    overwrite: bool = False,
    keep_manifest: bool = False,
) -> Path:
    """Write ``<path>/step<step>/rank<rank>/`` in msprobe's layout, atomically.
    ``keep_manifest``: the trace's manifest too, beside dump.json (``MANIFEST_SIDECAR``: the
    ``Recorder``'s step scalars, run settings and parallel block, which msprobe has no place for)."""
    import torch

    from .._atomic import temp_dir_beside

    root = Path(path)
    target = root / f"step{step}" / f"rank{rank}"
    if target.exists() and not overwrite:
        raise TraceError(f"{target}: a dump already exists there; refusing to overwrite it")
    target.parent.mkdir(parents=True, exist_ok=True)
    dump, construct, files = build_dump(trace, step)
    tmp = temp_dir_beside(target)
    sums = Checksums()  # sealed last: our dumps carry checksums (msprobe's own have none)
    try:
        if files:
            (tmp / "dump_tensor_data").mkdir()
            for name, rec in files.items():
                buffer = io.BytesIO()  # one tensor's bytes, hashed as they are written
                torch.save(trace.tensor(rec).detach().cpu().contiguous(), buffer)
                sums.write(tmp, f"dump_tensor_data/{name}", buffer.getvalue())
        dump["dump_data_dir"] = str(target / "dump_tensor_data") if files else None
        written = [("dump.json", dump), ("construct.json", construct), ("stack.json", _stack(dump))]
        if keep_manifest:
            written.append((MANIFEST_SIDECAR, redacted(dict(trace.manifest))))  # no secret in it
        for name, content in written:
            sums.write_json(tmp, name, content)
        sums.publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _stack(dump: Mapping[str, Any]) -> dict[str, Any]:
    return {"0": [list(dump["data"]), ["File pytest_precalign (recorded by hooks; no Python stack kept)"]]}
