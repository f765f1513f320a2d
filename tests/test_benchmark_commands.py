"""The benchmarks find ``precalign`` and ``msprobe`` beside the running interpreter: a venv's
python run without activating the venv (PATH without the venv's bin) crashed looking on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO

PROBE = "import sys; sys.path.insert(0, sys.argv[1]); from _commands import find_command; print(find_command(sys.argv[2]))"


def _find(name: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # the venv's bin is not on it
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO / "benchmarks"), name],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_precalign_and_msprobe_are_found_beside_the_interpreter() -> None:
    for name in ("precalign", "msprobe"):
        done = _find(name)
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()) == Path(sys.executable).parent / name


def test_a_missing_command_is_one_message() -> None:
    done = _find("no-such-precalign-tool")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"no-such-precalign-tool: not found beside {sys.executable} nor on PATH "
        "(install it into this interpreter's environment)"
    )
