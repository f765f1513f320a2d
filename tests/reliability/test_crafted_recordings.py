"""Crafted and partial recordings of a user's own run, told plainly (issue #47 item 2).

Small real recordings (a loop recorded with the ``Recorder`` in this process: milliseconds a
step), then crafted or cut the way a damaged, killed or hostile recording is, and compared with
``precalign compare`` (the CLI's ``main``): one message naming the file and the key (exit 2),
or the right verdict naming what happened (exit 1), never a traceback, never a clean pass.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from pytest_precalign.errors import RecorderError
from tests.helpers.files import reseal

from .crafted_runs import (
    copied,
    duplicate_in_safetensors_header,
    edit_text,
    manifest,
    record,
    shard,
)

MODES = ("scalars", "stats", "tensor", "hash")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A full run recorded in each mode and in msprobe's format."""
    base = tmp_path_factory.mktemp("runs")
    out = {mode: record(base / mode, mode=mode) for mode in MODES}
    out["msprobe"] = record(base / "msprobe", mode="stats", fmt="msprobe")
    return out


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["compare", str(a), str(b), *extra])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.out, captured.err


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# -- a key twice, at any depth, in any JSON file of a recording ------------------------------------

DUPLICATES: dict[str, tuple[str, str, str, Callable[[Path], Path]]] = {
    # name: (run, old text, new text, the file)
    "manifest top level": ("scalars", '"step": 1,', '"step": 1, "step": 1,', lambda r: manifest(r, 1)),
    "manifest scalars": (
        "scalars",
        '"scalars": {\n  "1": {',
        '"scalars": {\n  "1": {"step": 1, "loss": 1.0},\n  "1": {',
        lambda r: manifest(r, 1),
    ),
    "manifest scalars field": ("scalars", '"loss": ', '"loss": 1.0, "loss": ', lambda r: manifest(r, 1)),
    "manifest plan": ("scalars", '"optimizer": "sgd"', '"optimizer": "adamw", "optimizer": "sgd"', manifest),
    "manifest versions": ("stats", '"versions": {', '"versions": {"torch": "0", ', manifest),
    "index record": ("stats", '"seq": 0,', '"seq": 0, "seq": 0,', lambda r: manifest(r, 0, "index.json")),
    "index stats": ("stats", '"max": ', '"max": 0.0, "max": ', lambda r: manifest(r, 0, "index.json")),
    "msprobe dump.json": ("msprobe", '"Max": ', '"Max": 0.0, "Max": ', lambda r: manifest(r, 0, "dump.json")),
    "msprobe sidecar manifest": (
        "msprobe",
        '"step": 0,',
        '"step": 0, "step": 0,',
        lambda r: manifest(r, 0, "precalign_manifest.json"),
    ),
    "msprobe construct.json": (
        "msprobe",
        "{",
        '{"a": null, "a": null, ',
        lambda r: manifest(r, 0, "construct.json"),
    ),
}


@pytest.mark.parametrize("name", list(DUPLICATES))
def test_a_key_twice_anywhere_is_refused_naming_the_file(
    name: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, old, new, file_of = DUPLICATES[name]
    crafted = copied(runs[run], tmp_path / "crafted")
    file = file_of(crafted)
    edit_text(file, old, new)
    code, _, err = _compare(runs[run], crafted, capsys)
    line = _one_error(err)
    assert code == 2 and f"{file}: key " in line and "appears twice in one object" in line, line


def test_a_key_twice_in_a_safetensors_header_is_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crafted = copied(runs["tensor"], tmp_path / "crafted")
    duplicate_in_safetensors_header(shard(crafted))
    code, _, err = _compare(runs["tensor"], crafted, capsys)
    line = _one_error(err)
    assert code == 2 and f"{shard(crafted)}: key " in line and "appears twice" in line, line


def test_env_diff_reads_json_the_same_way(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crafted = copied(runs["stats"], tmp_path / "crafted")
    edit_text(manifest(crafted), '"seed": ', '"seed": 1, "seed": ')
    code = main(["env-diff", str(runs["stats"]), str(crafted)])
    line = _one_error(capsys.readouterr().err)
    assert code == 2 and f"{manifest(crafted)}: key 'seed' appears twice in one object" in line, line


# -- a run that stopped inside step k ---------------------------------------------------------------


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("mode", "at"),
    [(mode, 2) for mode in MODES]
    + [("scalars", 1), ("scalars", 3)]
    + [pytest.param(mode, at, marks=SLOW) for mode in MODES[1:] for at in (1, 3)],
)
def test_a_run_that_stopped_inside_step_k_is_told_so_in_every_mode(
    mode: str, at: int, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    killed = record(tmp_path / "killed", mode=mode, stop_inside=at)
    assert (killed / f"step{at}" / ".rank0.in-step").exists()
    code, out, _ = _compare(runs[mode], killed, capsys)
    assert code == 1 and "PASSED" not in out, out
    assert f"{killed}: step{at}/ is incomplete" in out and f"the run stopped inside step {at}" in out, out


def test_a_run_that_stopped_inside_step_k_in_msprobe_format_is_told_so(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    killed = record(tmp_path / "killed", mode="stats", fmt="msprobe", stop_inside=2)
    code, out, err = _compare(runs["msprobe"], killed, capsys)
    assert code == 1 and "PASSED" not in out, out + err
    assert f"{killed}: step2/ is incomplete" in out and "the run stopped inside step 2" in out, out


def test_a_run_that_ended_normally_leaves_no_marker(runs: dict[str, Path]) -> None:
    for root in runs.values():
        assert not list(root.rglob("*.in-step")), root


def test_a_step_given_up_and_caught_by_the_loop_leaves_no_marker(tmp_path: Path) -> None:
    import torch

    from pytest_precalign import Recorder

    model = torch.nn.Linear(2, 2)
    with Recorder(tmp_path / "run", mode="stats") as rec:
        with pytest.raises(ZeroDivisionError), rec.recording(model):
            model(torch.ones(1, 2))
            raise ZeroDivisionError
        with rec.recording(model):
            model(torch.ones(1, 2)).sum().backward()
    assert not list((tmp_path / "run").rglob("*.in-step"))
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["step0"]


# -- a root holds one run ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["scalars", "stats"])
def test_a_rerun_into_a_recorded_root_is_refused_before_its_first_step(mode: str, tmp_path: Path) -> None:
    root = record(tmp_path / "run", mode=mode)
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(
        RecorderError, match=r"already holds a recorded run \(step0, step1, step2, step3 of rank 0\)"
    ):
        record(root, mode=mode)
    assert sorted(p.name for p in root.iterdir()) == before


@pytest.mark.parametrize("mode", ["scalars", "stats", pytest.param("tensor", marks=SLOW)])
def test_a_rerun_with_overwrite_and_fewer_steps_leaves_no_old_step(
    mode: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = record(tmp_path / "run", mode=mode, steps=6)
    record(root, mode=mode, overwrite=True)
    assert sorted(p.name for p in root.iterdir()) == ["step0", "step1", "step2", "step3"]
    code, out, _ = _compare(runs[mode], root, capsys)
    assert code == 0, out


@pytest.mark.parametrize(
    ("mode", "at"),
    [(mode, 2) for mode in MODES] + [("scalars", 1)] + [pytest.param(m, 1, marks=SLOW) for m in MODES[1:]],
)
def test_a_resumed_run_continues_its_recording_and_compares_as_one_run(
    mode: str, at: int, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed inside step 3 after a checkpoint at step ``at``, resumed there into the same
    root: the steps the resume repeats are replaced, the run compares as the full one."""
    root = record(tmp_path / "run", mode=mode, stop_inside=3)
    record(root, mode=mode, first=at)
    assert not list(root.rglob("*.in-step"))
    code, out, _ = _compare(runs[mode], root, capsys)
    assert code == 0, out


def test_a_resumed_run_into_a_new_root_compares_with_its_first_part(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = record(tmp_path / "first", mode="scalars", stop_inside=2)
    second = record(tmp_path / "second", mode="scalars", first=2)
    assert sorted(p.name for p in second.iterdir()) == ["step2", "step3"]
    code, out, _ = _compare(runs["scalars"], first, capsys)
    assert code == 1 and "the run stopped inside step 2" in out


def test_two_recorders_on_one_root_at_once_are_refused_before_the_second_trains(tmp_path: Path) -> None:
    import torch

    from pytest_precalign import Recorder

    model = torch.nn.Linear(2, 2)
    first, second = Recorder(tmp_path / "run", mode="scalars"), Recorder(tmp_path / "run", mode="scalars")
    first.start(model)
    with pytest.raises(RecorderError, match="already being recorded by another recorder in this process"):
        second.start(model)
    first.record_scalars(loss=1.0)
    first.stop()
    first.close()
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["step0"]


# -- what the step computed -------------------------------------------------------------------------


def test_a_nan_loss_is_recorded_as_nan_and_fails_the_compare(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = record(tmp_path / "nan", mode="scalars", nan_at=2)
    scalars = json.loads(manifest(root, 2).read_text())["scalars"]["2"]
    assert math.isnan(scalars["loss"])
    code, out, _ = _compare(runs["scalars"], root, capsys)
    assert code == 1 and "PASSED" not in out, out


# -- Ctrl-C ----------------------------------------------------------------------------------------


# An interrupt raised between ``open()`` returning and its ``with`` taking the file leaves that
# file to the garbage collector (as it would in a process Ctrl-C ends): its ResourceWarning is
# the interrupt's, not a leak of the compare's; collected here, under this test's filter.
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupted_compare_is_one_line_and_exit_130(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """An interrupt (raised asynchronously, as SIGINT's handler raises it) while comparing."""
    import gc
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        for delay in (0.05, 0.02, 0.01, 0.005, 0.001):
            signal.setitimer(signal.ITIMER_REAL, delay)
            try:
                code = main(["compare", str(runs["tensor"]), str(runs["tensor"])])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            captured = capsys.readouterr()
            if code == 130:
                break
    finally:
        signal.signal(signal.SIGALRM, previous)
        gc.collect()
    assert code == 130
    assert _one_error(captured.err) == "precalign: interrupted (SIGINT); nothing more was done"


# -- look-alike folders, links and FIFOs inside a recording ----------------------------------------


def _lookalike_step(root: Path) -> str:
    copied(root / "step1", root / "step01")
    return "step01/ and step1/ name the same step 1"


def _lookalike_rank(root: Path) -> str:
    copied(root / "step1" / "rank0", root / "step1" / "rank00")
    return "rank0/ and rank00/ name the same rank 0"


def _linked_step(root: Path) -> str:
    (root / "step3").rename(root.parent / "elsewhere")
    (root / "step3").symlink_to(root.parent / "elsewhere")
    return f"{root / 'step3'}: a symbolic link inside"


def _linked_rank(root: Path) -> str:
    (root / "step2" / "rank0").rename(root.parent / "elsewhere")
    (root / "step2" / "rank0").symlink_to(root.parent / "elsewhere")
    return f"{root / 'step2' / 'rank0'}: a symbolic link inside"


def _linked_manifest(root: Path) -> str:
    file = manifest(root, 2)
    file.rename(root.parent / "elsewhere.json")
    file.symlink_to(root.parent / "elsewhere.json")
    return f"{file}: a symbolic link inside"


def _fifo_step(root: Path) -> str:
    import os

    os.mkfifo(root / "step4")
    return f"{root / 'step4'}: is a FIFO, expected a folder"


def _fifo_rank(root: Path) -> str:
    import os

    os.mkfifo(root / "step1" / "rank1")
    return f"{root / 'step1' / 'rank1'}: is a FIFO, expected a folder"


def _fifo_manifest(root: Path) -> str:
    import os

    manifest(root, 2).unlink()
    os.mkfifo(manifest(root, 2))
    return f"{manifest(root, 2)}: is a FIFO"


def _file_as_rank(root: Path) -> str:
    (root / "step1" / "rank1").write_text("")
    return f"{root / 'step1' / 'rank1'}: is a regular file, expected a folder"


FOLDERS: dict[str, Callable[[Path], str]] = {
    "step01 beside step1": _lookalike_step,
    "rank00 beside rank0": _lookalike_rank,
    "a step folder that is a link": _linked_step,
    "a rank folder that is a link": _linked_rank,
    "a manifest that is a link": _linked_manifest,
    "a FIFO named like a step": _fifo_step,
    "a FIFO named like a rank": _fifo_rank,
    "a FIFO as a manifest": _fifo_manifest,
    "a file named like a rank": _file_as_rank,
}


@pytest.mark.parametrize("mode", ["scalars", "stats"])
@pytest.mark.parametrize("name", list(FOLDERS))
def test_a_crafted_folder_is_refused_never_followed(
    name: str, mode: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crafted = copied(runs[mode], tmp_path / "crafted")
    says = FOLDERS[name](crafted)
    code, out, err = _compare(runs[mode], crafted, capsys)
    assert code == 2 and "PASSED" not in out, out + err
    line = _one_error(err)
    assert says in line, line


@pytest.mark.parametrize(
    "name", ["step01 beside step1", "rank00 beside rank0", "a rank folder that is a link"]
)
def test_a_crafted_folder_in_msprobe_format_is_refused(
    name: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crafted = copied(runs["msprobe"], tmp_path / "crafted")
    says = FOLDERS[name](crafted)
    code, out, err = _compare(runs["msprobe"], crafted, capsys)
    assert code == 2 and "PASSED" not in out, out + err
    assert says in _one_error(err)


# -- a request the run cannot meet -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "said"), [([5, 7], "5, 7"), ([0, 4], "4"), (list(range(4, 20)), "4, 5, 6, 7")]
)
def test_steps_beyond_the_planned_ones_are_refused_before_step_0(
    steps: list[int], said: str, tmp_path: Path
) -> None:
    import torch

    from pytest_precalign import Recorder
    from pytest_precalign.errors import ConfigError

    model = torch.nn.Linear(2, 2)
    rec = Recorder(tmp_path / "run", steps=steps)
    with pytest.raises(
        ConfigError, match=rf"Recorder: steps= {said}.* beyond the run's 4 optimizer steps \(0..3\)"
    ):
        rec.record_settings(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=4)
    assert not (tmp_path / "run").exists()


# -- output and reports bounded ----------------------------------------------------------------------

HUGE = 5_000_000


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"optimizer": "sgd"', '"optimizer": "' + "x" * HUGE + '"'),
        ('"loss_normalisation": null', '"loss_normalisation": "' + "y" * HUGE + '"'),
    ],
    ids=["optimizer", "loss_normalisation"],
)
def test_a_huge_string_in_a_plan_is_cut_in_the_output_and_the_report(
    old: str, new: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crafted = copied(runs["scalars"], tmp_path / "crafted")
    edit_text(manifest(crafted), old, new)
    code, out, err = _compare(runs["scalars"], crafted, capsys, "--report", str(tmp_path / "report"))
    assert code in (1, 2) and "PASSED" not in out
    assert len(out) + len(err) < 20_000, len(out) + len(err)
    assert "more characters cut" in out or (code == 2 and "..." in _one_error(err))  # a bad value: refused
    files = (
        [p for p in (tmp_path / "report").rglob("*") if p.is_file()] if (tmp_path / "report").exists() else []
    )
    assert sum(p.stat().st_size for p in files) < 500_000


# -- one run's settings ----------------------------------------------------------------------------


@pytest.mark.parametrize("step", [1, 3])
def test_a_second_contradicting_settings_block_is_refused(
    step: int, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crafted = copied(runs["scalars"], tmp_path / "crafted")
    training = json.loads(manifest(crafted, 0).read_text())["training"]
    training["plan"]["lr"][0] = [0.5]  # another run's plan
    data = json.loads(manifest(crafted, step).read_text())
    manifest(crafted, step).write_text(json.dumps({**data, "training": training}))
    reseal(manifest(crafted, step))
    code, _, err = _compare(runs["scalars"], crafted, capsys)
    line = _one_error(err)
    assert code == 2 and f"step{step}/rank0/manifest.json: a second 'training' block" in line, line


def test_a_resumed_run_writes_no_second_settings_block(tmp_path: Path) -> None:
    root = record(tmp_path / "run", mode="scalars", stop_inside=3)
    record(root, mode="scalars", first=2)  # a loop that writes its settings again on resuming
    blocks = [s for s in range(4) if "training" in json.loads(manifest(root, s).read_text())]
    assert blocks == [0]


def test_accelerate_steps_beyond_total_steps_are_refused_at_once(tmp_path: Path) -> None:
    import torch
    from accelerate import Accelerator

    from pytest_precalign import AccelerateSteps
    from pytest_precalign.errors import ConfigError

    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(
        torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters())
    )
    with pytest.raises(
        ConfigError, match=r"AccelerateSteps: steps= 9 beyond the run's 4 optimizer steps \(0..3\)"
    ):
        AccelerateSteps(tmp_path / "run", accelerator, model, optimizer, total_steps=4, steps=[1, 9])
    assert not (tmp_path / "run").exists()


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning")
def test_lightning_steps_beyond_the_run_are_refused_before_it_trains(tmp_path: Path) -> None:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from pytest_precalign import PrecalignLightningCallback
    from pytest_precalign.errors import ConfigError

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Linear(2, 1)
            self.steps = 0

        def training_step(self, batch: object, index: int) -> torch.Tensor:
            self.steps += 1
            x, y = batch  # type: ignore[misc]
            return torch.nn.functional.mse_loss(self.model(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(torch.ones(4, 2), torch.ones(4, 1))
    callback = PrecalignLightningCallback(tmp_path / "run", steps=[0, 6], module="model")
    quiet = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, callbacks=[callback], **quiet)
    module = Module()
    with pytest.raises(
        ConfigError, match=r"PrecalignLightningCallback: steps= 6 beyond the run's 2 optimizer steps"
    ):
        trainer.fit(module, DataLoader(data, batch_size=2))
    assert module.steps == 0 and not (tmp_path / "run").exists()


def test_a_long_plan_is_parsed_once_per_side(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3,000-step plan (a 300,000-step one was parsed 8 times per compare, seconds each)."""
    import pytest_precalign.trace.training_record as training_record

    sides = [copied(runs["scalars"], tmp_path / name) for name in ("a", "b")]
    for side in sides:
        data = json.loads(manifest(side).read_text())
        data["training"]["plan"]["lr"] = [[0.1]] * 3_000
        manifest(side).write_text(json.dumps(data))
        reseal(manifest(side))
    parsed = []
    real = training_record.plan_from_dict
    monkeypatch.setattr(training_record, "plan_from_dict", lambda *a: parsed.append(1) or real(*a))
    code, out, _ = _compare(sides[0], sides[1], capsys)
    assert code == 0, out
    assert len(parsed) == 2  # once for each side
