"""Recorder per-step scalars: ``mode="scalars"`` adds no hooks and writes each step's manifest
alone (a few hundred bytes); other modes keep layers for the steps asked and scalars for all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pytest_precalign import Recorder
from pytest_precalign.trace.native_io import read_trace
from pytest_precalign.trace.step_scalars import StepScalars, scalars_of


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_scalars_mode_writes_the_manifest_alone_and_adds_no_hooks(tmp_path: Path) -> None:
    model = _model()
    rec = Recorder(tmp_path / "run", mode="scalars")
    rec.record_initial_params(model)
    for step in range(3):
        rec.start(model)
        assert not rec.recording_now and not model[0]._forward_hooks
        model(torch.ones(2, 4)).sum().backward()
        rec.record_scalars(loss=1.5 + step, lr=[0.1, 0.0], grad_norm=2.0)
        rec.stop()
        rec.step()
    folders = sorted((tmp_path / "run").glob("step*/rank0"))
    assert [f.parent.name for f in folders] == ["step0", "step1", "step2"]
    for step, folder in enumerate(folders):
        trace = read_trace(folder)
        assert trace.records == ()
        assert scalars_of(trace.manifest) == {
            step: StepScalars(step=step, loss=1.5 + step, lr=(0.1, 0.0), grad_norm=2.0)
        }
        assert sum(f.stat().st_size for f in folder.iterdir()) <= 4096  # <= 4 KB a step
    assert "initial_params" in json.loads((folders[0] / "manifest.json").read_text())
    assert "initial_params" not in json.loads((folders[1] / "manifest.json").read_text())


def test_stats_on_selected_steps_and_scalars_on_every_step(tmp_path: Path) -> None:
    model = _model()
    with Recorder(tmp_path / "run", mode="stats", steps=[1]) as rec:
        for step in range(3):
            rec.start(model)
            model(torch.ones(2, 4)).sum().backward()
            rec.record_scalars(StepScalars(step=step, loss=float(step)))
            rec.stop()
            rec.step()
    traces = {s: read_trace(tmp_path / "run" / f"step{s}" / "rank0") for s in range(3)}
    assert traces[0].records == () and traces[2].records == () and traces[1].records
    assert all(scalars_of(t.manifest)[s].loss == float(s) for s, t in traces.items())


def test_scalars_of_another_step_or_both_forms_are_refused(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run", mode="scalars")
    with pytest.raises(ValueError, match="scalars of step 4 in step 0"):
        rec.record_scalars(StepScalars(step=4))
    with pytest.raises(ValueError, match="not both"):
        rec.record_scalars(StepScalars(step=0), loss=1.0)
    with pytest.raises(ValueError, match="unknown mode 'scalar'"):
        Recorder(tmp_path / "x", mode="scalar")
