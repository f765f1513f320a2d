"""Fuzzing the readers of user input with hypothesis: configs (YAML text and mutated
structures), msprobe dumps (mutated dump.json / construct.json of a real sample) and traces
(mutated manifest.json / index.json, truncated shards). Whatever the input, only the
project's typed errors (errors.py) escape: a ``PrecalignError`` with a message, never another
exception. Example counts come from the "precalign" profile in tests/conftest.py
(PRECALIGN_FUZZ_EXAMPLES=N to fuzz longer).
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import PrecalignError
from pytest_precalign.msprobe import read_msprobe_dump
from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.native_io import read_trace, write_trace
from pytest_precalign.trace.records import Trace, record_id
from tests.helpers.files import reseal
from tests.helpers.paths import MSPROBE_DATA

DATA = MSPROBE_DATA
SAMPLE = next((DATA / "tiny_statistics_L0").glob("step0/*"))

CONFIG = {
    "version": 1,
    "defaults": {"device": "cpu", "dtype": "float32", "seed": 0, "deterministic": True},
    "models": {
        "base": {"source": "factory", "factory": "m:build", "kwargs": {"width": 4}},
        "cand": {
            "source": "hf",
            "class": "transformers.Qwen2ForCausalLM",
            "config": {"vocab_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1},
        },
    },
    "inputs": {"toks": {"kind": "tokens", "batch": 1, "seq_len": 3, "vocab_size": 8, "labels": True}},
    "tolerances": {
        "t": [{"match": "*", "atol": 1e-5, "rtol": 0.0, "why": "x"}, {"match": "*", "cosine": 0.99}]
    },
    "mappings": {
        "m": {
            "renames": [{"baseline": "layers.{i}", "candidate": "blocks.{i}"}],
            "tensors": [
                {"baseline": ["a", "b"], "candidate": "c", "transform": [{"op": "concat", "dim": 0}]}
            ],
        }
    },
    "cases": [
        {
            "name": "c1",
            "baseline": "base",
            "candidate": "cand",
            "inputs": "toks",
            "phases": ["forward", "backward", "step"],
            "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.999]},
            "record": {"mode": "tensor", "include": ["*"]},
            "tolerances": "t",
            "mapping": "m",
            "expect": {"phase": "forward", "first_divergence": "x", "origin": True},
            "search": {"max_examples": 3, "batch": [1, 2], "seq_len": [1, 4], "padding": True},
        }
    ],
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["*", "forward", "tokens", "preset:megatron-qwen2.5", "m:build", "float32", "c1", "t"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


@st.composite
def mutated(draw: Any, document: Any, count: int = 3) -> Any:
    """``document`` with up to ``count`` edits: a value replaced, a key or item deleted, or
    a key added, anywhere in the tree."""
    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, count))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        new = draw(json_values)
        if not path:
            doc = new
            continue
        *head, last = path
        parent = doc
        for key in head:
            parent = parent[key]
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if op == "replace":
            parent[last] = new
        elif op == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = new
        else:
            parent.insert(last, new)
    return doc


def _only_typed_errors(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except PrecalignError as exc:
        assert str(exc).strip(), "a typed error without a message"
        return None


# -- configs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


@given(doc=mutated(CONFIG))
def test_mutated_config_structure(folder: Path, doc: Any) -> None:
    text = yaml.safe_dump(doc, sort_keys=False)
    _only_typed_errors(load_config, text, folder / "align.yaml")


@given(text=st.one_of(st.text(max_size=200), st.integers(0, 2000).map(lambda n: yaml.safe_dump(CONFIG)[:n])))
def test_config_text(folder: Path, text: str) -> None:
    """Any text, and every truncation of a valid config."""
    _only_typed_errors(load_config, text, folder / "align.yaml")


def test_unmutated_config_is_valid(folder: Path) -> None:
    assert load_config(yaml.safe_dump(CONFIG), folder / "align.yaml").cases[0].search is not None


# -- msprobe dumps ---------------------------------------------------------------------------

DUMP = json.loads((SAMPLE / "dump.json").read_text())
CONSTRUCT = json.loads((SAMPLE / "construct.json").read_text())
# A few records keep the mutated documents small and the fuzzing fast.
RECORDS = dict(list(DUMP["data"].items())[:12])
SMALL_DUMP = {**DUMP, "data": RECORDS}


def _read_dump(folder: Path, dump: Any, construct: Any) -> Trace:
    rank = folder / "step0" / "rank0"
    shutil.rmtree(folder / "step0", ignore_errors=True)
    rank.mkdir(parents=True)
    (rank / "dump.json").write_text(json.dumps(dump))
    reseal(rank / "dump.json")
    (rank / "construct.json").write_text(json.dumps(construct))
    trace = read_msprobe_dump(rank)
    for record in trace.records:  # what compare reads of every record
        _ = (record.id, record.stats, record.crc32, record.shape, record.dtype)
    return trace


def _tensors(slot: str, value: Any, kind: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, slot, tensor) for each tensor in a dump entry's value, nested lists and dicts
    flattened into the slot (``in.position_embeddings.0``); None and scalars hold none."""
    if isinstance(value, dict) and value.get("type") == "torch.Tensor":
        return [(kind, slot, value)]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    sep = "" if slot.endswith(".") else "."
    return [t for key, v in items for t in _tensors(f"{slot}{sep}{key}", v, kind)]


def _stat(value: float | None) -> float:
    return math.nan if value is None else float(value)


def test_small_dump_reads(folder: Path) -> None:
    """Every tensor the dump holds reads back as one record, under its module's name, with the
    dump's dtype, shape and statistics."""
    trace = _read_dump(folder, SMALL_DUMP, CONSTRUCT)
    by_id = trace.by_id()
    expected = {}
    for key, entry in RECORDS.items():
        prefix, module, forward, call = re.fullmatch(r"(Module)\.(.+)\.\w+\.(forward)\.(\d+)", key).groups()
        assert (prefix, forward, call) == ("Module", "forward", "0"), key
        outputs = entry["output"]
        slots = (
            _tensors("out", outputs[0], "activation")
            if len(outputs) == 1
            else _tensors("out.", outputs, "activation")
        )
        slots += _tensors("in.", entry["input_args"], "input")
        slots += _tensors("in.", entry["input_kwargs"], "input")
        slots += _tensors("param.", entry.get("parameters", {}), "input")
        expected |= {record_id(module, kind, slot, 0, 0): tensor for kind, slot, tensor in slots}
    assert sorted(by_id) == sorted(expected)
    for rid, tensor in expected.items():
        rec = by_id[rid]
        assert (rec.phase, rec.dtype, rec.shape) == (
            "forward",
            tensor["dtype"].removeprefix("torch."),
            tuple(tensor["shape"]),
        ), rid
        assert rec.stats is not None, rid
        got = (rec.stats.max, rec.stats.min, rec.stats.mean, rec.stats.norm)
        want = tuple(_stat(tensor[k]) for k in ("Max", "Min", "Mean", "Norm"))
        assert got == pytest.approx(want, nan_ok=True), rid
    # execution order: a module's output comes after its inputs, and modules in dump order
    names = list(dict.fromkeys(r.name for r in trace.records if r.kind == "activation"))
    assert names[:3] == ["model.embed_tokens", "model.rotary_emb", "model.layers.0.input_layernorm"]


@given(dump=mutated(SMALL_DUMP, 4))
def test_mutated_dump_json(folder: Path, dump: Any) -> None:
    _only_typed_errors(_read_dump, folder, dump, CONSTRUCT)


@given(construct=mutated(CONSTRUCT, 3))
def test_mutated_construct_json(folder: Path, construct: Any) -> None:
    _only_typed_errors(_read_dump, folder, SMALL_DUMP, construct)


@given(name=st.text(max_size=60), body=st.sampled_from(list(RECORDS.values())))
def test_record_names(folder: Path, name: str, body: Any) -> None:
    _only_typed_errors(_read_dump, folder, {**SMALL_DUMP, "data": {name: body}}, CONSTRUCT)


# -- traces ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_trace(folder: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU(), torch.nn.Linear(3, 2))
    with HookRecorder(model, mode="tensor") as rec:
        model(torch.randn(2, 4)).sum().backward()
    return write_trace(rec.trace({"case": "t"}), folder / "good")


def _read_all(root: Path) -> None:
    trace = read_trace(root)
    for record in trace.records:
        if record.tensor_key is not None:
            trace.tensor(record)


def _broken_copy(good: Path, folder: Path) -> Path:
    target = folder / "broken"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(good, target)
    return target


@given(data=st.data())
def test_mutated_index_json(good_trace: Path, folder: Path, data: st.DataObject) -> None:
    root = _broken_copy(good_trace, folder)
    index = json.loads((root / "index.json").read_text())
    index["records"] = index["records"][:6]  # small documents: fast mutation
    (root / "index.json").write_text(json.dumps(data.draw(mutated(index, 3))))
    reseal(root / "index.json")
    _only_typed_errors(_read_all, root)


@given(data=st.data())
def test_mutated_manifest_json(good_trace: Path, folder: Path, data: st.DataObject) -> None:
    root = _broken_copy(good_trace, folder)
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps(data.draw(mutated(manifest, 3))))
    reseal(root / "manifest.json")
    _only_typed_errors(_read_all, root)


@given(cut=st.integers(0, 10_000), file=st.sampled_from(["manifest.json", "index.json", "shard"]))
def test_truncated_files(good_trace: Path, folder: Path, cut: int, file: str) -> None:
    root = _broken_copy(good_trace, folder)
    path = next(root.glob("*.safetensors")) if file == "shard" else root / file
    data = path.read_bytes()
    path.write_bytes(data[: cut % max(len(data), 1)])
    _only_typed_errors(_read_all, root)


@given(junk=st.binary(min_size=0, max_size=64), at=st.integers(0, 10_000))
def test_corrupted_shard_bytes(good_trace: Path, folder: Path, junk: bytes, at: int) -> None:
    root = _broken_copy(good_trace, folder)
    path = next(root.glob("*.safetensors"))
    data = bytearray(path.read_bytes())
    at %= len(data)
    data[at : at + len(junk)] = junk
    path.write_bytes(bytes(data))
    _only_typed_errors(_read_all, root)
