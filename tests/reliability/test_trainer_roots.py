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
    # the same checkpoint resumed into a new root: it holds the steps after the checkpoint and
    # points to its first part (the checkpoint's stateful callback state): one run with it, the
    # first part's steps 2, 3 being the work the resume repeated
    rest = _run(tmp_path, "rest", "--resume", "resumed.out/checkpoint-2")
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "rest").iterdir()) == ["step2", "step3"]
    pointer = json.loads((tmp_path / "rest" / "step2" / "rank0" / "manifest.json").read_text())["continues"]
    assert pointer["root"] == "../resumed" and pointer["step"] == 1, pointer
    done = _compare(tmp_path, "full", "rest")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_trainer_stopped_at_its_checkpoint_and_resumed_into_a_new_root_compares_as_one_run(
    tmp_path: Path,
) -> None:
    """A job that stops after step 2 (its checkpoint saved there), relaunched from the
    checkpoint into a new output root: both orders of compare with the full run pass; a NaN
    planted after the resume is found at its step; the first part moved away is one refusal."""
    assert _run(tmp_path, "full").returncode == 0
    assert _run(tmp_path, "job1", "--stop-after", "2").returncode == 0
    assert sorted(p.name for p in (tmp_path / "job1").iterdir()) == ["step0", "step1"]
    for name, extra in (("job2", ()), ("job2-nan", ("--nan-at", "1"))):  # this process's 2nd: step 3
        done = _run(tmp_path, name, "--resume", "job1.out/checkpoint-2", *extra)
        assert done.returncode == 0, done.stderr[-3000:]
    for a, b in (("full", "job2"), ("job2", "full")):
        done = _compare(tmp_path, a, b)
        assert done.returncode == 0, done.stdout + done.stderr
    done = _compare(tmp_path, "full", "job2-nan")
    assert done.returncode == 1 and "step 3 diverged first: loss" in done.stdout, done.stdout + done.stderr
    (tmp_path / "job1").rename(tmp_path / "elsewhere")
    done = _compare(tmp_path, "full", "job2")
    assert done.returncode == 2 and "job1 does not exist: the first part was moved or removed" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_trainer_recorded_only_once_resumed_saves_its_checkpoints_and_says_it_has_no_first_part(
    tmp_path: Path,
) -> None:
    """The checkpoint was saved without the callback (no entry in ``stateful_callbacks``):
    transformers' next save looks the callback's entry up (a KeyError ended the run before the
    callback added it), and the run warns that its new root compares as a run of its own."""
    assert _run(tmp_path, "job1", "--stop-after", "2", "--unrecorded").returncode == 0
    cmd = [sys.executable, "-W", "always::RuntimeWarning", str(HERE / "resume_run.py")]
    env = {**_env(), "PYTHONWARNINGS": "always::RuntimeWarning"}
    done = subprocess.run(
        [*cmd, "job2", "--resume", "job1.out/checkpoint-2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "job2.out" / "checkpoint-4").is_dir()
    assert "does not say where its steps before 2 were recorded" in done.stderr, done.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "job2").iterdir()) == ["step2", "step3"]


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
