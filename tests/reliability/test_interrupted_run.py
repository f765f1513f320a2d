"""A training run killed mid-step (kill -9 while the Recorder's writer fills step<N>/'s
temporary folder) is still comparable: the complete steps are compared and the verdict fails
naming the incomplete step -- it is never a clean pass as if every step had been compared.
The runs are real Recorder runs in subprocesses; the kill is a real SIGKILL."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from pytest_precalign.errors import TraceError

# Records steps 0..argv[2]-1 of a tiny model into argv[1] (tensor mode: a background writer);
# with argv[3] == "kill", step argv[2] starts, runs forward and backward, and the process kills
# itself with SIGKILL before stop().
RUN = """
import os, signal, sys
import torch
from pytest_precalign import Recorder
root, steps, kill = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "kill"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
rec = Recorder(root, mode="tensor")
for step in range(steps + kill):
    rec.start(model)
    loss = model(torch.ones(3, 4)).sum()
    rec.record_output("loss", loss)
    loss.backward()
    if step == steps:
        os.kill(os.getpid(), signal.SIGKILL)
    opt.step(); opt.zero_grad()
    rec.stop(); rec.step()
"""


def _run(root: Path, steps: int, kill: bool = False) -> Path:
    done = subprocess.run([sys.executable, "-c", RUN, str(root), str(steps), "kill" if kill else "-"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == (-9 if kill else 0), done.stderr
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two real runs (three steps; two steps and a kill in the third) and folders made of
    their step folders: the first two steps of the full run, the killed step alone."""
    base = tmp_path_factory.mktemp("interrupted")
    full3, killed2 = _run(base / "full3", 3), _run(base / "killed2", 2, kill=True)
    for step in (0, 1):
        shutil.copytree(full3 / f"step{step}", base / "full2" / f"step{step}")
    shutil.copytree(killed2 / "step2", base / "killed0" / "step0")
    return {"full3": full3, "full2": base / "full2", "killed2": killed2, "killed0": base / "killed0"}


def test_the_kill_leaves_step2_with_only_the_writers_temporary_folder(runs: dict[str, Path]) -> None:
    step2 = runs["killed2"] / "step2"
    names = sorted(p.name for p in step2.iterdir())
    assert ".rank0.in-step" in names  # the marker of the step that began and never ended
    names.remove(".rank0.in-step")
    assert len(names) == 1 and names[0].startswith(".rank0.") and names[0].endswith(".tmp")


def _compare(golden: Path, target: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["compare", str(golden), str(target), "--report", str(out)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_partial_last_step_on_one_side_compares_the_rest_and_fails_naming_it(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = _compare(runs["full3"], runs["killed2"], tmp_path / "out", capsys)
    assert code == 1, text
    why = f"{runs['killed2']}: step2/ is incomplete (rank0/ was never published"
    assert why in text and "steps 0, 1 compared" in text
    entries = json.loads((tmp_path / "out" / "report.json").read_text())["cases"]
    assert entries and all(not e["passed"] for e in entries)
    assert all(any(why in line for line in e["incomplete_steps"]) for e in entries)
    assert all(e["compared"] > 0 for e in entries)  # steps 0 and 1 were compared
    only_golden = [u for e in entries for u in e["unmatched"]["baseline"]]  # its step 2
    assert only_golden and all(
        "step 2 is incomplete on the candidate side" in u["reason"] for u in only_golden
    )


def test_a_partial_step_on_both_sides_is_not_a_clean_pass(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = _compare(runs["killed2"], runs["killed2"], tmp_path / "out", capsys)
    assert code == 1, text
    assert "FAILED" in text and "PASSED" not in text
    assert text.count(f"{runs['killed2']}: step2/ is incomplete") >= 2  # each side, in each phase


def test_complete_runs_of_the_same_steps_still_pass(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = _compare(runs["full2"], runs["full2"], tmp_path / "out", capsys)
    assert code == 0, text
    assert "incomplete" not in text


def test_a_run_whose_only_step_is_partial_is_refused(runs: dict[str, Path]) -> None:
    from pytest_precalign.run.stored_runs import load_side

    root = runs["killed0"]
    with pytest.raises(
        TraceError, match="step0/ holds only a writer.s temporary folder: the run was interrupted"
    ):
        load_side(root)
