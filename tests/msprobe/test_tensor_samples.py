"""The tiny tensor-mode samples at every level (L0, L1, mix): their indexes load, and the
tensors kept here (a few per dump, to keep the repo small) match dump.json's statistics."""

from __future__ import annotations

import pytest

from pytest_precalign.errors import TraceError
from pytest_precalign.msprobe import read_msprobe_dump
from tests.helpers.paths import MSPROBE_DATA

DATA = MSPROBE_DATA


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_tensor_sample_loads_and_kept_tensors_match_their_stats(level):
    folder = DATA / f"tiny_tensor_{level}_partial"
    trace = read_msprobe_dump(folder)
    assert trace.manifest["task"] == "tensor" and trace.manifest["level"] == level
    assert trace.mode == "tensor"
    kinds = {r.kind for r in trace.records}
    assert {"activation", "input"} <= kinds
    if level != "L0":
        assert any(r.module_class == "api" for r in trace.records)
    if level != "L1":
        assert any(r.name == "lm_head" for r in trace.records)
    kept = {p.name for p in next(folder.glob("step0/*")).glob("dump_tensor_data/*.pt")}
    checked = 0
    for rec in trace.records:
        if rec.tensor_key in kept and rec.stats is not None and rec.dtype.startswith("float"):
            tensor = trace.tensor(rec)
            assert tuple(tensor.shape) == rec.shape
            assert float(tensor.max()) == pytest.approx(rec.stats.max, rel=1e-6, abs=1e-6)
            assert float(tensor.norm()) == pytest.approx(rec.stats.norm, rel=1e-5)
            checked += 1
    assert checked >= 2
    missing = next(r for r in trace.records if r.tensor_key is not None and r.tensor_key not in kept)
    with pytest.raises(TraceError, match="missing"):
        trace.tensor(missing)
