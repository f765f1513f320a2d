"""bfloat16 tensors read from disk reach the compare as their raw bits and are widened a chunk
at a time (``Trace.raw_array``, ``fused_pass`` ``widen=``): the results are those of the
widened-up-front path, in our trace format and in msprobe's."""

from __future__ import annotations

from dataclasses import astuple
from pathlib import Path

import numpy as np
import pytest
import torch

from pytest_precalign.compare import fused_pass
from pytest_precalign.msprobe.writer import write_msprobe_dump
from pytest_precalign.recording import HookRecorder
from pytest_precalign.run.offline import compare_runs
from pytest_precalign.trace.native_io import write_trace
from pytest_precalign.trace.records import Trace


def _record(bump: float, dtype: torch.dtype) -> Trace:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.GELU(), torch.nn.Linear(300, 8)).to(dtype)
    if bump:
        with torch.no_grad():
            model[0].weight[3, 5] += bump
    x = torch.randn(700, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    with HookRecorder(model, mode="tensor") as rec:
        model(x).float().sum().backward()
    return rec.trace({"side": "x"})


def _sides(tmp_path: Path, fmt: str, dtype: torch.dtype) -> tuple[Path, Path]:
    out = []
    for name, bump in (("golden", 0.0), ("target", 0.5)):
        trace = _record(bump, dtype)
        if fmt == "native":
            out.append(write_trace(trace, tmp_path / name))
        else:
            out.append(write_msprobe_dump(trace, tmp_path / name))
    return out[0], out[1]


def _results(golden: Path, target: Path) -> list[tuple[object, ...]]:
    run = compare_runs(golden, target)
    return [
        (p.record.id, p.status, p.evidence, p.checks, astuple(p.closeness) if p.closeness else None)
        for p in run.comparison.pairs
    ]


@pytest.mark.parametrize("fmt", ["native", "msprobe"])
def test_raw_bf16_gives_the_widened_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    monkeypatch.setenv("PRECALIGN_COMPARE_THREADS", "1")
    golden, target = _sides(tmp_path, fmt, torch.bfloat16)
    seen: list[tuple[bool, bool]] = []
    measure = fused_pass.measure_pair

    def spy(*args: object, **kwargs: object) -> fused_pass.PairMeasure:
        seen.append(args[7] if len(args) > 7 else kwargs.get("widen", (False, False)))  # type: ignore[arg-type]
        return measure(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_pass, "measure_pair", spy)
    raw = _results(golden, target)
    assert seen and all(w == (True, True) for w in seen)  # every pair read as raw bits
    seen.clear()
    monkeypatch.setattr(Trace, "raw_array", lambda self, rec: (self.array(rec), False))
    widened = _results(golden, target)
    assert seen and all(w == (False, False) for w in seen)
    assert raw == widened
    assert any(status == "fail" for _, status, *_ in raw) and any(status == "ok" for _, status, *_ in raw)


def test_raw_bits_are_the_bf16_patterns_and_other_dtypes_are_not_raw(tmp_path: Path) -> None:
    golden, _ = _sides(tmp_path, "native", torch.bfloat16)
    from pytest_precalign.run.stored_runs import load_side

    trace = load_side(golden)
    rec = next(r for r in trace.records if trace.has_tensor(r))
    bits, raw = trace.raw_array(rec)
    assert raw and bits.dtype == np.uint16
    widened = trace.array(rec)
    assert np.array_equal((bits.astype(np.uint32) << 16).view(np.float32), widened)
    fp32, _ = _sides(tmp_path / "fp32", "native", torch.float32)
    trace32 = load_side(fp32)
    rec32 = next(r for r in trace32.records if trace32.has_tensor(r))
    array, raw32 = trace32.raw_array(rec32)
    assert not raw32 and array.dtype == np.float32


@pytest.mark.parametrize("other", [torch.float32, torch.float64])
def test_bf16_against_a_wider_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: torch.dtype
) -> None:
    """bf16 bits against fp32 (widened per chunk) or fp64 (widened up front, compared in
    float64): the widened path's results either way."""
    monkeypatch.setenv("PRECALIGN_COMPARE_THREADS", "1")
    golden = write_trace(_record(0.0, torch.bfloat16), tmp_path / "golden")
    target = write_trace(_record(0.5, other), tmp_path / "target")
    raw = _results(golden, target)
    monkeypatch.setattr(Trace, "raw_array", lambda self, rec: (self.array(rec), False))
    assert raw == _results(golden, target)
    assert any(status == "fail" for _, status, *_ in raw)
