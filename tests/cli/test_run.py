"""``precalign run``: the suite's cases without pytest; exit 0 when aligned, 1 on a divergence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.nets import write_mlp_suite


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_precalign", "run", "align.yaml", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_run_exit_codes(tmp_path: Path) -> None:
    write_mlp_suite(tmp_path)
    ok = _run(tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "PASSED port[forward]" in ok.stdout
    write_mlp_suite(tmp_path, bug="own")
    bad = _run(tmp_path, "--report", "out")
    assert bad.returncode == 1
    assert "First divergence: blocks.1" in bad.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["cases"][0]["first_divergence"]["name"] == "blocks.1"
