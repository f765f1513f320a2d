"""A user's Trainer run with ``PrecalignCallback`` (``resume_run.py``, a real script in a
subprocess, then ``precalign compare``): resumed from its checkpoint into the same root and a
new one, the
callback added twice, a NaN loss. Slow: a Trainer script costs 10-30 s on 2 shared cores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO, SRC

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{SRC}:{REPO}", "PYTHONWARNINGS": "ignore"}


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(HERE / "resume_run.py"), *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600, check=False)


def _compare(cwd: Path, a: str, b: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest_precalign", "compare", a, b]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600, check=False)


def test_a_trainer_resumed_into_the_same_root_continues_and_compares_as_one_run(tmp_path: Path) -> None:
    assert _run(tmp_path, "full").returncode == 0
    first = _run(tmp_path, "resumed")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = _run(tmp_path, "resumed", "--resume", "resumed.out/checkpoint-2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]  # today: TraceError at step 2
    assert sorted(p.name for p in (tmp_path / "resumed").iterdir()) == ["step0", "step1", "step2", "step3"]
    done = _compare(tmp_path, "full", "resumed")
    assert done.returncode == 0, done.stdout + done.stderr
    # the same checkpoint resumed into a new root: it holds the steps after the checkpoint, a new
    # run id (no mix with the first part's), and compares with the full run on those steps only
    rest = _run(tmp_path, "rest", "--resume", "resumed.out/checkpoint-2")
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "rest").iterdir()) == ["step2", "step3"]
    done = _compare(tmp_path, "full", "rest")
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "steps 0-1 recorded by the baseline only" in out, out
    assert "diverged first" not in out, out  # steps 2, 3 are the full run's


def test_the_callback_added_twice_is_refused_before_the_first_step_trains(tmp_path: Path) -> None:
    done = _run(tmp_path, "twice", "--twice")
    assert done.returncode == 1
    assert (
        "RecorderError: Recorder: twice (rank 0) is already being recorded by another recorder" in done.stderr
    )
    assert not (tmp_path / "twice" / "step0" / "rank0").exists()  # no step trained


def test_a_nan_loss_is_recorded_as_the_step_computed_it(tmp_path: Path) -> None:
    done = _run(tmp_path, "nan", "--nan-at", "2", "--steps", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    scalars = json.loads((tmp_path / "nan" / "step2" / "rank0" / "manifest.json").read_text())["scalars"]
    assert math.isnan(scalars["2"]["loss"])  # today: 0.0, the Trainer's logging_nan_inf_filter stand-in


def test_steps_beyond_max_steps_are_said_before_training(tmp_path: Path) -> None:
    done = _run(tmp_path, "beyond", "--select", "2", "5", "7")
    assert done.returncode == 1
    assert (
        "ConfigError: PrecalignCallback: steps= 5, 7 beyond the run's 4 optimizer steps (0..3): "
        "they would record nothing" in done.stderr
    )
    assert not (tmp_path / "beyond").exists()  # today: steps 5 and 7 silently never recorded
