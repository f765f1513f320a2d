from __future__ import annotations

import json

import pytest
import torch

from pytest_precalign.errors import TraceError
from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.native_io import read_trace, write_trace
from pytest_precalign.trace.records import Trace


def _trace(mode: str = "tensor") -> Trace:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    with HookRecorder(model, mode=mode) as rec:
        model(torch.randn(3, 4)).sum().backward()
    return rec.trace({"case": "t", "side": "baseline"})


@pytest.mark.parametrize("mode", ["tensor", "stats", "hash"])
def test_round_trip(tmp_path, mode):
    trace = _trace(mode)
    write_trace(trace, tmp_path / "tr")
    back = read_trace(tmp_path / "tr")
    assert back.records == trace.records
    assert back.manifest["case"] == "t" and back.manifest["record_mode"] == mode
    for r in trace.records:
        if r.tensor_key is not None:
            assert torch.equal(back.tensor(r), trace.tensor(r))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tr"]  # no temp dirs left behind


def test_never_overwritten_silently(tmp_path):
    trace = _trace()
    write_trace(trace, tmp_path / "tr")
    before = (tmp_path / "tr" / "index.json").read_bytes()
    with pytest.raises(TraceError, match="a trace already exists there; refusing to overwrite it"):
        write_trace(_trace("stats"), tmp_path / "tr")
    assert (tmp_path / "tr" / "index.json").read_bytes() == before
    write_trace(_trace("stats"), tmp_path / "tr", overwrite=True)
    assert read_trace(tmp_path / "tr").manifest["record_mode"] == "stats"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tr"]


def test_failed_write_leaves_nothing(tmp_path):
    trace = _trace()
    bad = Trace(trace.manifest, trace.records, {**trace.tensors, "oops": "not a tensor"})
    with pytest.raises(AttributeError):
        write_trace(bad, tmp_path / "tr")
    assert list(tmp_path.iterdir()) == []


def test_corrupt_traces_give_one_clear_error(tmp_path):
    write_trace(_trace(), tmp_path / "tr")
    root = tmp_path / "tr"
    with pytest.raises(TraceError, match="no trace directory there"):
        read_trace(tmp_path / "missing")
    (root / "checksums.json").unlink()  # a recording written before checksums: the deeper checks
    index = json.loads((root / "index.json").read_text())
    key = next(r["tensor_key"] for r in index["records"] if r["tensor_key"])
    del index["shards"][key]
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(TraceError, match=f"points at tensor '{key}', which no shard holds"):
        read_trace(root)
    (root / "index.json").write_text("{ not json")
    with pytest.raises(TraceError, match=r"index.json: cannot read"):
        read_trace(root)
    (root / "manifest.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(TraceError, match="not a pytest-precalign trace manifest"):
        read_trace(root)


def test_truncated_shard_is_a_trace_error(tmp_path):
    write_trace(_trace(), tmp_path / "tr")
    shard = next((tmp_path / "tr").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(TraceError, match=f"{shard}: content changed after it was recorded"):
        read_trace(tmp_path / "tr")
    (tmp_path / "tr" / "checksums.json").unlink()  # a recording written before checksums
    trace = read_trace(tmp_path / "tr")
    record = next(r for r in trace.records if r.tensor_key)
    with pytest.raises(TraceError, match="cannot read tensor"):
        trace.tensor(record)
