"""Issue #47: Ctrl-C during ``precalign compare`` is one line and exit 130, as a user sees it:
the real CLI in a subprocess, a real SIGINT sent once the compare is reading the recording
(one of its files is open in the process), never a traceback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pytest_precalign import Recorder
from tests.helpers.paths import SRC


def _big_recording(root: Path) -> Path:
    """A tensor-mode run large enough that its compare takes seconds (8 layers of 512, 4 steps)."""
    torch.manual_seed(0)
    layers = [m for _ in range(8) for m in (torch.nn.Linear(512, 512), torch.nn.Tanh())]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(root, mode="tensor")
    for step in range(4):
        rec.start(model)
        loss = model(torch.randn(128, 512, generator=torch.Generator().manual_seed(step))).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        rec.record_scalars(loss=loss.item(), lr=[0.01])
        rec.stop()
        rec.step()
    rec.close()
    return root


def _reading(pid: int, root: Path) -> bool:
    """Whether process ``pid`` has a file of ``root`` open (the compare is reading it)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(root)):
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see the compare reading")
def test_sigint_during_a_compare_is_one_line_and_exit_130(tmp_path: Path) -> None:
    base = _big_recording(tmp_path / "base")
    cand = shutil.copytree(base, tmp_path / "cand")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_precalign", "compare", str(base), str(cand)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and not _reading(proc.pid, tmp_path) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the compare ended before it was seen reading: make the recording bigger"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert err.strip() == "precalign: interrupted (SIGINT); nothing more was done", err
    assert "Traceback" not in out + err
