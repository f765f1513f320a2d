"""Live compare with a golden run (``Recorder(..., golden=PATH)``): a tiny Qwen2 from seed 0,
a golden run, and candidates with one faulty layer (``FAULTY``'s output x 1.01). Only records
beyond tolerance (and the inputs of their module) keep tensors, and the origin named from the
live trace is the one named from full tensor traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_precalign import Recorder
from pytest_precalign.errors import ConfigError
from pytest_precalign.training.golden import GoldenError
from tests.helpers.live_runs import FAULTY, faulty, origin, record_step, tiny_qwen2


def index(folder: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads((folder / "index.json").read_text())["records"]
    return records


def live(folder: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
    return dict(manifest["live"])


def rid(r: dict[str, Any]) -> str:
    return f"{r['name']}|{r['kind']}|{r['slot']}|{r['step']}|{r['call']}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("live")
    model = tiny_qwen2()
    out = {
        "golden": record_step(model, root / "golden"),
        "golden_tensor": record_step(model, root / "golden_tensor", mode="tensor"),
        "golden_hash": record_step(model, root / "golden_hash", mode="hash"),
    }
    out["aligned"] = record_step(model, root / "aligned", golden=root / "golden")
    with faulty(model, scale=1.01):
        out["full"] = record_step(model, root / "full", mode="tensor")
        out["live"] = record_step(model, root / "live", golden=root / "golden")
        out["live_hash"] = record_step(model, root / "live_hash", golden=root / "golden_hash")
    return out


def test_aligned_candidate_keeps_no_tensor(runs: dict[str, Path]) -> None:
    records = index(runs["aligned"])
    summary = live(runs["aligned"])
    assert summary["compared"] == summary["records"] == len(records) > 100
    assert summary["beyond"] == [] and summary["kept_tensors"] == 0 == summary["kept_bytes"]
    assert "no_golden" not in summary
    assert not [r for r in records if r["tensor_key"]]
    assert all(r["stats"] is not None for r in records)
    assert not list(runs["aligned"].glob("*.safetensors"))


def entries(beyond: set[str], by_id: dict[str, dict[str, Any]]) -> set[str]:
    """The beyond records where the divergence enters: none of their deps is beyond (module
    inputs and output grads flow in from elsewhere; a loss without deps is an output), and
    no earlier phase has a beyond record (the backward is downstream of a forward fault)."""
    phases = ("forward", "backward", "step")
    first = min((phases.index(by_id[b]["phase"]) for b in beyond), default=0)
    return {
        b
        for b in beyond
        if by_id[b]["kind"] not in ("input", "grad_output")
        and not (by_id[b]["kind"] in ("loss", "logits") and not by_id[b]["deps"])
        and not set(by_id[b]["deps"]) & beyond
        and phases.index(by_id[b]["phase"]) == first
    }


def test_faulty_layer_keeps_tensors_where_the_divergence_enters(runs: dict[str, Path]) -> None:
    records = index(runs["live"])
    summary = live(runs["live"])
    by_id = {rid(r): r for r in records}
    kept = {rid(r) for r in records if r["tensor_key"]}
    beyond = set(summary["beyond"])
    entry = entries(beyond, by_id)
    assert f"{FAULTY}|activation|out|0|0" in entry
    assert entry <= kept
    # besides the entries: their deps (the module's inputs), and records of the same tensor
    needed = entry | {d for e in entry for d in by_id[e]["deps"]}
    keys = {by_id[n]["tensor_key"] for n in needed if n in by_id}
    assert {by_id[k]["tensor_key"] for k in kept} <= keys
    assert f"{FAULTY}|input|in.0|0|0" in kept  # the origin's inputs: it is proven
    # downstream records (their inputs beyond already) keep statistics only
    downstream = {b for b in beyond - entry if by_id[b]["kind"] not in ("input", "grad_output")}
    assert "lm_head|activation|out|0|0" in downstream
    assert {by_id[e]["phase"] for e in entry} == {"forward"}
    assert summary["downstream"] == len(downstream) > 10
    assert not [k for k in kept if k.startswith("model.layers.0.")]
    assert summary["kept_tensors"] == len({by_id[k]["tensor_key"] for k in kept}) < len(records) // 10
    assert all(r["stats"] is not None for r in records)
    full = sum(f.stat().st_size for f in runs["full"].glob("*.safetensors"))
    assert 0 < summary["kept_bytes"] < full / 10


def test_origin_from_live_trace_is_the_one_from_full_tensors(runs: dict[str, Path]) -> None:
    from_full = origin(runs["golden_tensor"], runs["full"])
    assert from_full == (FAULTY, FAULTY)
    assert origin(runs["golden"], runs["live"]) == from_full
    assert origin(runs["golden_tensor"], runs["live"]) == from_full


def test_hash_golden_is_compared_by_hash(runs: dict[str, Path]) -> None:
    records = index(runs["live_hash"])
    summary = live(runs["live_hash"])
    assert summary["compared"] == len(records)
    assert all(r["crc32"] and r["stats"] for r in records)
    at = [rid(r) for r in records].index(f"{FAULTY}|activation|out|0|0")
    before = [r for r in records[:at] if r["tensor_key"]]
    assert {r["kind"] for r in before} == {"input"}  # of the faulty module and its enclosing ones
    assert f"{FAULTY}|input|in.0|0|0" in {rid(r) for r in before}
    assert summary["beyond"][0] == f"{FAULTY}|activation|out|0|0"
    assert origin(runs["golden_hash"], runs["live_hash"]) == (FAULTY, FAULTY)


def test_msprobe_golden_records_without_counterpart_are_kept_and_listed(tmp_path: Path) -> None:
    model = tiny_qwen2()
    record_step(model, tmp_path / "msprobe", format="msprobe")  # msprobe's dump layout
    folder = record_step(model, tmp_path / "live", golden=tmp_path / "msprobe")
    summary = live(folder)
    records = index(folder)
    assert summary["beyond"] == [] and summary["compared"] > 0.9 * len(records)
    by_id = {rid(r): r for r in records}
    kept = {rid(r) for r in records if r["tensor_key"]}
    # msprobe names some records differently (the loss, a ModelOutput's field): fail closed,
    # they keep their tensors (and their modules' inputs: records of the same tensor share it)
    missing = set(summary["no_golden"])
    assert "loss|loss||0|0" in missing and missing <= kept
    needed = missing | {d for m in missing for d in by_id[m]["deps"]}
    assert {by_id[k]["tensor_key"] for k in kept} <= {by_id[n]["tensor_key"] for n in needed if n in by_id}


def test_tensor_golden_and_the_tolerance_table(tmp_path: Path, runs: dict[str, Path]) -> None:
    model = tiny_qwen2()
    golden = runs["golden_tensor"]  # a tensor-mode golden: its statistics are compared
    with faulty(model, scale=1.01):
        strict = record_step(model, tmp_path / "strict", golden=golden)
        table = tmp_path / "loose.yaml"
        table.write_text('- {match: "*", atol: 1.0, rtol: 0.1, why: "loose"}\n', encoding="utf-8")
        loose = record_step(model, tmp_path / "loose", golden=golden, tolerances=table)
    assert f"{FAULTY}|activation|out|0|0" in live(strict)["beyond"]
    assert live(strict)["beyond"] == live(runs["live"])["beyond"]  # as against the stats golden
    summary = live(loose)
    assert summary["table"] == "loose" and summary["beyond"] == [] and summary["kept_tensors"] == 0


def test_missing_golden_is_one_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_run"
    with pytest.raises(GoldenError, match=f"golden {missing}: no such file or directory"):
        Recorder(tmp_path / "out", golden=missing)
    assert issubclass(GoldenError, ConfigError)
    empty = tmp_path / "empty"
    empty.mkdir()
    rec = Recorder(tmp_path / "out", golden=empty)
    with pytest.raises(GoldenError, match=f"golden {empty}: neither a pytest-precalign trace"):
        rec.start(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="golden= keeps tensors only where needed"):
        Recorder(tmp_path / "out", golden=empty, mode="tensor")


def test_golden_of_another_model_is_reported_not_dropped(tmp_path: Path, runs: dict[str, Path]) -> None:
    other = torch.nn.Sequential(torch.nn.Linear(4, 4))  # none of the golden's names
    x = torch.ones(2, 4)
    rec = Recorder(tmp_path / "other", golden=runs["golden"], params=False)
    with rec.recording(other):
        other(x).sum().backward()
    summary = live(rec.written[-1])
    assert summary["compared"] == 0 and len(summary["no_golden"]) == summary["records"] > 0
    assert summary["kept_tensors"] == summary["records"]  # each a tensor of its own
    assert "no golden counterpart" in summary["warning"]
    # the same names with other shapes: a shape mismatch on each, tensors kept
    wide = tiny_qwen2()
    mlp = wide.get_submodule("model.layers.2.mlp")
    mlp.gate_proj, mlp.up_proj = torch.nn.Linear(32, 48, bias=False), torch.nn.Linear(32, 48, bias=False)
    mlp.down_proj = torch.nn.Linear(48, 32, bias=False)
    folder = record_step(wide, tmp_path / "wide", golden=runs["golden"])
    summary = live(folder)
    assert "model.layers.2.mlp.up_proj|activation|out|0|0" in summary["shape_mismatch"]
    kept = {rid(r) for r in index(folder) if r["tensor_key"]}
    assert set(summary["shape_mismatch"]) <= kept
