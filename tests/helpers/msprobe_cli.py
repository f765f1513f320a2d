"""The real ``msprobe compare`` (the test extra installs mindstudio-probe) on our dumps."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

needs_msprobe = pytest.mark.skipif(
    shutil.which("msprobe") is None, reason="mindstudio-probe (the test extra) is not installed"
)


def msprobe_compare(candidate: Path, golden: Path, out: Path) -> str:
    """Run ``msprobe compare``, assert it succeeded with no error logged (CANN's absence aside),
    and return the text of the one compare_result_*.csv it wrote."""
    done = subprocess.run(
        [
            shutil.which("msprobe") or "msprobe",
            "compare",
            "-tp",
            str(candidate),
            "-gp",
            str(golden),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "msprobe compare ends successfully" in log
    assert [line for line in log.splitlines() if "[ERROR]" in line and "CANN" not in line] == []
    (csv,) = out.rglob("compare_result_*.csv")
    return csv.read_text()
