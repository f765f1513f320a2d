"""example_suites/inhouse_trainer: a team's own training loop registered as a case trainer
from outside the package (its conftest's ``pytest_precalign_trainers`` hook), run as a user
runs the folder: ``pytest`` in it, a subprocess. Both sides of each case train with it, are
recorded and judged step by step: the clean port passes every phase, the port whose block
output is scaled fails from step 0. A hook returning a name the package already has stops
pytest with one usage error, before any case."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import EXAMPLES, REPO


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=folder, capture_output=True, text=True, check=False, timeout=600,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_an_inhouse_loop_registered_from_a_conftest_trains_and_is_judged(tmp_path: Path) -> None:
    folder = shutil.copytree(EXAMPLES / "inhouse_trainer", tmp_path / "suite")
    done = _pytest(folder, "--align-save-traces", str(tmp_path / "saved"))
    out = done.stdout
    assert done.returncode == 1 and "3 failed, 3 passed" in out, out + done.stderr
    for phase in ("forward", "backward", "step"):
        assert f"PASSED same_port[{phase}]" in out and f"FAILED scaled_block[{phase}]" in out
    assert "step 0 diverged first: forward (head)" in out
    for side in ("baseline", "candidate"):
        manifest = json.loads(
            (tmp_path / "saved" / "align" / "same_port" / side / "manifest.json").read_text()
        )
        assert manifest["training"]["trainer"] == "company_loop"
        assert sorted(manifest["scalars"]) == ["0", "1"]


def test_a_hook_registering_a_taken_name_is_a_usage_error(tmp_path: Path) -> None:
    folder = shutil.copytree(EXAMPLES / "inhouse_trainer", tmp_path / "suite")
    conftest = folder / "conftest.py"
    conftest.write_text(conftest.read_text().replace('TrainerInfo("company_loop"', 'TrainerInfo("loop"'))
    done = _pytest(folder)
    assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr
    assert (
        "ERROR: pytest_precalign_trainers: register_trainer: a trainer named 'loop' is already "
        "registered (the tool's torch.optim loop, driver pytest_precalign.run.trainers.loop); choose another name"
    ) in done.stderr
