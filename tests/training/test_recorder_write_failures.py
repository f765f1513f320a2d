"""A full disk (or a quota, a file size limit) while the ``Recorder`` writes a step (issue #34
item 4): one ``RecorderError`` naming the step and the folder, no half-written step folder
left, and a later ``precalign compare`` says what happened -- it was a raw ``OSError: [Errno
28]`` from the JSON writer in the user's loop, an empty ``step4/``, and "step4/ is incomplete".

The user's loop runs as a real script in a subprocess, on a real small tmpfs when this test
may mount one (root), and under a real file size limit (RLIMIT_FSIZE: EFBIG) everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_precalign
from pytest_precalign.cli import main

SRC = Path(pytest_precalign.__file__).resolve().parents[1]  # the package under test

LOOP = """
import resource, signal, sys
import torch
from pytest_precalign import Recorder

root, limit_at = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a killed process
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
rec = Recorder(root, mode="stats")
for step in range(400):
    if step == limit_at:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, resource.RLIM_INFINITY))
    rec.start(model)
    loss = model(torch.randn(8, 64)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    rec.record_scalars(loss=loss.item(), lr=[0.1])
    rec.stop()
    rec.step()
print("all steps written")
"""


def _run_loop(tmp_path: Path, root: Path, limit_at: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    return subprocess.run(
        [sys.executable, str(script), str(root), str(limit_at)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=False,
    )


def _check_failed_step(done: subprocess.CompletedProcess[str], root: Path, reason: str) -> int:
    """The step the loop stopped at, checked: one RecorderError, nothing half written."""
    assert done.returncode == 1 and "all steps written" not in done.stdout, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pytest_precalign.errors.RecorderError: Recorder: step "), done.stderr[-3000:]
    step = int(last.split("step ", 1)[1].split()[0])
    folder = root / f"step{step}"
    assert last == (
        f"pytest_precalign.errors.RecorderError: Recorder: step {step} was not recorded: cannot write "
        f"{folder / 'rank0'}: {reason}; nothing of the step was kept; "
        f"{folder / '.rank0.write-failed'} says so to a later compare"
    )
    assert "OSError" not in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == [".rank0.write-failed"]  # no rank0/, no .tmp
    return step


def _compare_says(root: Path, step: int, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(root), str(root)]) == 1
    out = capsys.readouterr().out
    assert (
        f"{root}: step{step}/ is incomplete (rank0/ was not written: the Recorder could not write it: {reason})"
    ) in out, out


def test_a_file_size_limit_mid_run_is_one_recorder_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "run"
    done = _run_loop(tmp_path, root, limit_at=3)
    step = _check_failed_step(done, root, "File too large (EFBIG)")
    assert step == 3
    _compare_says(root, step, "File too large (EFBIG)", capsys)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> object:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_full_disk_is_one_recorder_error(
    tmp_path: Path, small_tmpfs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = small_tmpfs / "run"
    done = _run_loop(tmp_path, root, limit_at=-1)
    step = _check_failed_step(done, root, "No space left on device (ENOSPC)")
    assert step >= 2  # the disk filled up after some steps
    _compare_says(root, step, "No space left on device (ENOSPC)", capsys)
