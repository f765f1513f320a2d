"""Issue #47, item 2: a run resumed into a new root (a cluster job relaunched into a new output
folder) compares as one run with its first part. The resumed run is told where its first part
is (``Recorder.seek(step, continues=FIRST_ROOT)``; the callbacks keep it in their checkpoint
state); every manifest of the new root points to it (``trace.run_parts``) and ``precalign
compare`` joins the parts, or refuses, naming both roots, a first part that is missing, moved,
replaced by another run or cut short, and parts that overlap. Real recordings (the ``Recorder``
on a 2-layer MLP, ``crafted_runs``) compared in-process; the Trainer's path is
``tests/user_runs/test_trainer_resume_new_root.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_precalign import Recorder
from pytest_precalign.cli import main
from pytest_precalign.errors import RecorderError
from pytest_precalign.trace.run_ids import RUN_ID_KEY
from pytest_precalign.trace.run_parts import CONTINUES_KEY
from tests.helpers.files import reseal

from .crafted_runs import manifest, record

SLOW = pytest.mark.slow


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["compare", str(a), str(b)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.err.strip() if code == 2 else captured.out


def _parts(tmp_path: Path, mode: str = "stats", fmt: str = "native") -> tuple[Path, Path, Path]:
    """The full run (steps 0..3); its first part, killed inside step 3 after a checkpoint at
    step 2 (steps 0..2 recorded, step 3 begun); the run resumed from that checkpoint into a
    new root (steps 2, 3: step 2 of the first part is work the resume repeated)."""
    full = record(tmp_path / "full", mode=mode, fmt=fmt)
    first = record(tmp_path / "job1", mode=mode, fmt=fmt, stop_inside=3)
    resumed = record(tmp_path / "job2", mode=mode, fmt=fmt, first=2, continues=first)
    return full, first, resumed


FORMATS = {"stats": ("stats", "native"), "scalars": ("scalars", "native"), "msprobe": ("stats", "msprobe")}


@pytest.mark.parametrize(
    "name", ["stats", pytest.param("scalars", marks=SLOW), pytest.param("msprobe", marks=SLOW)]
)
def test_a_run_resumed_into_a_new_root_compares_as_one_run(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mode, fmt = FORMATS[name]
    full, first, resumed = _parts(tmp_path, mode, fmt)
    file = "manifest.json" if fmt == "native" else "precalign_manifest.json"
    held = json.loads(manifest(resumed, 2, file).read_text())
    first_id = json.loads(manifest(first, 0, file).read_text())[RUN_ID_KEY]
    assert held[CONTINUES_KEY] == {"root": "../job1", "run_id": first_id, "step": 1}
    assert held[RUN_ID_KEY] == first_id  # the parts are one run
    joined = f"{resumed}: one run joined from its parts: steps up to 1 from {first} (the part before it)"
    for a, b in ((full, resumed), (resumed, full)):
        code, out = _compare(a, b, capsys)
        assert code == 0 and "stopped inside" not in out and joined in out, out
    planted = record(tmp_path / "job2-nan", mode=mode, fmt=fmt, first=2, continues=first, nan_at=3)
    code, out = _compare(full, planted, capsys)
    assert code == 1 and "step 3 diverged first: loss" in out, out


@SLOW
def test_parts_moved_together_still_join(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The pointer is relative to the new root: both parts moved into an archive still join."""
    full, first, resumed = _parts(tmp_path)
    (tmp_path / "archive").mkdir()
    for part in (first, resumed):
        shutil.move(part, tmp_path / "archive" / part.name)
    assert _compare(full, tmp_path / "archive" / "job2", capsys)[0] == 0


@SLOW
def test_a_step_folder_of_the_new_root_is_that_step_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full, _, resumed = _parts(tmp_path)
    code, out = _compare(full / "step3", resumed / "step3", capsys)
    assert code == 0, out  # the pointer is relative to the root, not followed from a step folder


def _dp_run(root: Path, *, first: int = 0, stop_after: int = 4, continues: Path | None = None) -> Path:
    """Both ranks of a 2-rank data-parallel run (the same rows on each replica) recorded as
    its processes would, steps ``first`` .. ``stop_after - 1`` (the steps before ``first``
    trained unrecorded, from the same seed)."""
    import torch

    for rank in (0, 1):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = Recorder(root, mode="stats", layout={"dp": 2, "rank": rank})
        rec.seek(first, continues=continues)
        for step in range(stop_after):
            if step >= first:
                rec.start(model)
            model(torch.full((2, 4), float(step + 1))).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step >= first:
                rec.stop()
                rec.step()
        rec.close()
    return root


@SLOW
def test_a_data_parallel_run_resumed_into_a_new_root_joins_rank_by_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = _dp_run(tmp_path / "full")
    first = _dp_run(tmp_path / "job1", stop_after=2)
    resumed = _dp_run(tmp_path / "job2", first=2, continues=first)
    ids = {
        json.loads(manifest(resumed, 2).parent.parent.joinpath(f"rank{r}/manifest.json").read_text())[
            RUN_ID_KEY
        ]
        for r in (0, 1)
    }
    assert len(ids) == 2  # each rank continues its own run id
    assert _compare(full, resumed, capsys)[0] == 0


def _rerun_first(first: Path) -> None:
    record(first, mode="stats", overwrite=True)  # another run replaced the first part


def _cut_first(first: Path) -> None:
    shutil.rmtree(first / "step1")


def _remove_first(first: Path) -> None:
    shutil.rmtree(first)


def _edit_pointer(path: Path, **changes: object) -> None:
    held = json.loads(path.read_text())
    held[CONTINUES_KEY].update(changes)
    path.write_text(json.dumps(held))
    reseal(path)  # crafted as someone would elsewhere: the chain's own checks refuse it


def _overlap(first: Path) -> None:
    for step in (2, 3):
        _edit_pointer(manifest(first.parent / "job2", step), step=2)


def _two_pointers(first: Path) -> None:
    _edit_pointer(manifest(first.parent / "job2", 3), root="../job0")


REFUSALS = {
    "removed": (
        _remove_first,
        "but {first} does not exist: the first part was moved or removed; put it back there",
    ),
    "replaced": (
        _rerun_first,
        "another run replaced the first part (a rerun into it?); the parts are not one run",
    ),
    "cut short": (_cut_first, "but the first part ends at step 0: its steps 1..1 are missing"),
    "overlap": (_overlap, "but {resumed} holds step2 too: the parts overlap"),
    "two pointers": (
        _two_pointers,
        "{resumed}: its steps of rank 0 disagree on where the run's first part is",
    ),
}


@SLOW
@pytest.mark.parametrize("name", list(REFUSALS))
def test_a_chain_that_does_not_hold_one_run_is_refused(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full, first, resumed = _parts(tmp_path)
    damage, expected = REFUSALS[name]
    damage(first)
    code, err = _compare(full, resumed, capsys)
    assert code == 2 and "\n" not in err, err
    assert expected.format(first=first, resumed=resumed) in err, err
    if name != "two pointers":
        assert f"{resumed} continues the run recorded in {first} (after its step " in err, err


def test_a_resume_told_a_first_part_that_holds_none_of_its_steps_is_refused_before_it_trains(
    tmp_path: Path,
) -> None:
    import torch

    model = torch.nn.Linear(4, 2)
    rec = Recorder(tmp_path / "job2", mode="stats")
    rec.seek(2, continues=tmp_path / "job1")
    with pytest.raises(RecorderError, match="continues the recording in .*job1, but .*job1 does not exist"):
        rec.start(model)
    assert not (tmp_path / "job2").exists()
    rec.close()


@SLOW
def test_a_run_resumed_twice_into_new_roots_joins_its_three_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed inside step 2, resumed at 2 into b and killed inside step 4, resumed at 3 into c:
    c -> b (steps 2) -> a (steps 0, 1) is one run of 5 steps."""
    full = record(tmp_path / "full", mode="stats", steps=5)
    a = record(tmp_path / "a", mode="stats", steps=5, stop_inside=2)
    b = record(tmp_path / "b", mode="stats", steps=5, first=2, continues=a, stop_inside=4)
    c = record(tmp_path / "c", mode="stats", steps=5, first=3, continues=b)
    code, out = _compare(full, c, capsys)
    assert code == 0 and "stopped inside" not in out, out
