"""benchmarks/real_bugs.py on three of its real bugs, the ones that need no second venv, so
the benchmark cannot rot: each is recorded on its user's path (an accelerate loop with
``AccelerateSteps``, a Lightning run with ``PrecalignLightningCallback``, a ``transformers.Trainer``
run of the user's own model with ``PrecalignCallback``), judged by ``precalign compare`` and scored; its clean twin
must pass. The full benchmark (22 bugs, with release venvs) is ``python benchmarks/real_bugs.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO, SRC

SUBSET = "accelerate_scheduler_every_micro_batch,lightning_partial_accumulation,custom_model_no_loss_kwargs"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(SRC), os.environ.get("PYTHONPATH")))),
    }
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "real_bugs.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


def test_subset_is_detected_at_its_step_and_twins_pass(tmp_path: Path) -> None:
    proc = _run("--only", SUBSET, "--out", str(tmp_path / "real_bugs"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["ran"] == 3
    assert figures["detected"] == 3
    assert figures["right_step"] == 3
    assert figures["false_alarms"] == 0
    rows = {r["name"]: r for r in figures["rows"]}
    assert rows["accelerate_scheduler_every_micro_batch"]["fault"]["found"] == [0, "schedule", "lr[0]"]
    assert rows["lightning_partial_accumulation"]["fault"]["found"][:2] == [2, "loss"]
    assert rows["custom_model_no_loss_kwargs"]["fault"]["found"] == [0, "settings", "loss_normalisation"]
    assert all(r["right_class"] and r["right_origin"] for r in rows.values())
    # a re-implementation records both sides in one process (the import paid once)
    assert all(list(r["recording"]) == ["fixed+buggy"] for r in rows.values())
    table = (tmp_path / "real_bugs.md").read_text(encoding="utf-8")
    assert (
        "| accelerate_scheduler_every_micro_batch | accelerate | accelerate issue #963, PR #999 | re-implementation |"
        in table
    )
    # a re-implementation says why no release was used
    assert "## Why no release" in table
    assert "- **accelerate_scheduler_every_micro_batch**: tried: accelerate 0.15.0 (buggy)" in table
    assert "## Candidates found but not yet reproduced" in table


def test_unknown_bug_is_one_clear_error() -> None:
    proc = _run("--only", "no_such_bug")
    assert proc.returncode == 2
    assert "--only: unknown bug(s) no_such_bug (allowed:" in proc.stderr
    assert "Traceback" not in proc.stderr
