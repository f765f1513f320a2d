"""Run the user scripts of a framework's own training loop (``lightning_run.py``,
``accelerate_run.py``) as a user runs them, several at once, and ``precalign compare`` their
recordings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.helpers.paths import REPO, SRC

HERE = Path(__file__).resolve().parent


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "PYTHONWARNINGS": "ignore",
    }


def run_scripts(script: str, runs: Mapping[str, Sequence[str]], out: Path) -> dict[str, dict[str, Any]]:
    """Each run ``name -> extra args`` of ``script`` in its own process, at once; what each run
    saw (its OUT.json), by name. ``--root ROOT`` in the args is relative to ``out``."""
    procs = {}
    for name, args in runs.items():
        cmd = [sys.executable, str(HERE / script), str(out / f"{name}.json"), *args]
        procs[name] = subprocess.Popen(
            cmd, cwd=out, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    seen = {}
    for name, proc in procs.items():
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{script} {name} failed:\n{output[-3000:]}"
        seen[name] = json.loads((out / f"{name}.json").read_text())
    return seen


def compare(baseline: Path, candidate: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest_precalign", "compare", str(baseline), str(candidate), *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)


def manifests(root: Path) -> dict[int, dict[str, Any]]:
    """Each step folder's manifest (rank 0) of a recording, by step."""
    out = {}
    for folder in sorted(root.glob("step*/rank0")):
        out[int(folder.parent.name[4:])] = json.loads((folder / "manifest.json").read_text())
    return out
