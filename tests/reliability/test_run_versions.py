"""Issue #47, item 2: a root holds one run, read as one version or refused. Every Recorder
manifest holds its run's ``run_id`` (kept by a resumed run) and its launch's ``launch_id``
(``trace.run_ids``); a compare refuses a root whose steps come from more than one run, or
whose step's ranks come from more than one launch. A tensor file loaded lazily, after the
folder's checksums were checked, must be the file that was hashed (``checksums.check_opened``).
Real recordings (the ``Recorder`` on a 2-layer MLP, ``crafted_runs``) compared in-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pytest_precalign import Recorder
from pytest_precalign._atomic import publish_dir, temp_dir_beside
from pytest_precalign.cli import main
from pytest_precalign.errors import TraceError
from pytest_precalign.trace.run_ids import LAUNCH_ID_KEY, RUN_ID_KEY
from tests.helpers.msprobe_cli import msprobe_compare, needs_msprobe

from .crafted_runs import copied, record

MIXED_RUNS = "holds steps of more than one run on rank 0"
MIXED_LAUNCHES = "its ranks come from more than one launch"
LOADED_CHANGED = "changed after its checksum was checked (replaced or rewritten by another write"
SLOW = pytest.mark.slow
NAMES = [pytest.param("scalars", marks=SLOW), "stats", pytest.param("msprobe", marks=SLOW)]
FORMATS = {"scalars": ("scalars", "native"), "stats": ("stats", "native"), "msprobe": ("stats", "msprobe")}


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["compare", str(a), str(b)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.err.strip() if code == 2 else captured.out


def _ids(root: Path, key: str = RUN_ID_KEY) -> dict[str, object]:
    out = {}
    for step in sorted(root.glob("step*/rank*")):
        name = "manifest.json" if (step / "manifest.json").is_file() else "precalign_manifest.json"
        out[f"{step.parent.name}/{step.name}"] = json.loads((step / name).read_text()).get(key)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_manifest_holds_its_runs_id_kept_by_a_resume_new_on_a_rerun(name: str, tmp_path: Path) -> None:
    mode, fmt = FORMATS[name]
    root = record(tmp_path / "run", mode=mode, fmt=fmt, stop_inside=3)
    first = set(_ids(root).values())
    assert len(first) == 1 and all(isinstance(i, str) and len(i) == 32 for i in first), _ids(root)
    record(root, mode=mode, fmt=fmt, first=2)  # resumed from a checkpoint at step 2: continues
    assert set(_ids(root).values()) == first and len(_ids(root)) == 4
    record(root, mode=mode, fmt=fmt, overwrite=True)  # a rerun replaces it whole: a new run
    rerun = set(_ids(root).values())
    assert len(rerun) == 1 and rerun != first
    elsewhere = set(_ids(record(tmp_path / "new", mode=mode, fmt=fmt, first=2)).values())
    assert len(elsewhere) == 1 and elsewhere.isdisjoint(first | rerun)  # resumed into a new root


@pytest.mark.parametrize("name", NAMES)
def test_a_root_holding_steps_of_two_runs_is_refused(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step 1 of another run of the same loop (bitwise the same numbers) put into the root,
    whole and sealed, as a second writer publishes it."""
    mode, fmt = FORMATS[name]
    one, other = record(tmp_path / "one", mode=mode, fmt=fmt), record(tmp_path / "other", mode=mode, fmt=fmt)
    assert _compare(one, other, capsys)[0] == 0  # two runs of the same loop: aligned
    mixed = copied(one, tmp_path / "mixed")
    tmp = temp_dir_beside(mixed / "step1" / "rank0")
    shutil.copytree(other / "step1" / "rank0", tmp, dirs_exist_ok=True)
    publish_dir(tmp, mixed / "step1" / "rank0")
    code, err = _compare(one, mixed, capsys)
    assert code == 2 and err.startswith(
        f"precalign: error: {mixed}: {MIXED_RUNS} (step0, step2, step3 from "
    ), err
    assert "step1 from " in err and "\n" not in err


def _loop(rec: Recorder, model: torch.nn.Module, steps: range) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        rec.start(model)
        loss = model(torch.full((2, 4), float(step + 1))).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        rec.record_scalars(loss=loss.item(), lr=[0.1])
        rec.stop()
        rec.step()


def test_two_writers_on_one_root_leave_a_root_the_compare_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run records steps 0, 1; a second run with ``overwrite=True`` starts into the same root
    (it removes the first's steps) and records step 0; the first run goes on with step 2."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    first, second = (
        Recorder(tmp_path / "run", mode="stats"),
        Recorder(tmp_path / "run", mode="stats", overwrite=True),
    )
    _loop(first, model, range(2))
    _loop(second, model, range(1))
    _loop(first, model, range(2, 3))
    first.close()
    second.close()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step0", "step2"]
    code, err = _compare(tmp_path / "run", tmp_path / "run", capsys)
    assert code == 2 and f"{MIXED_RUNS} (step0 from " in err and "step2 from " in err, err


def test_an_overwrite_part_way_through_reads_as_the_new_run_stopped_inside_its_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rerun with ``overwrite=True`` that has recorded steps 0, 1 and is inside step 2 when
    the compare starts: the old run's steps are all gone (removed before the rerun's step 0
    trained), the compare reads the new run alone and says it stopped inside step 2."""
    full = record(tmp_path / "full", mode="stats")
    root = record(tmp_path / "run", mode="stats", steps=6)
    old = set(_ids(root).values())
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    rerun = Recorder(root, mode="stats", overwrite=True)
    _loop(rerun, model, range(2))
    rerun.start(model)  # inside step 2
    try:
        assert sorted(p.name for p in root.iterdir()) == ["step0", "step1", "step2"]
        assert [p.name for p in (root / "step2").iterdir()] == [".rank0.in-step"]
        assert set(_ids(root).values()).isdisjoint(old) and len(set(_ids(root).values())) == 1
        code, out = _compare(full, root, capsys)
        assert code == 1 and "the run stopped inside step 2" in out, out
    finally:
        rerun.close()


def _rank_run(
    root: Path, rank: int, monkeypatch: pytest.MonkeyPatch, launch: str, overwrite: bool = False
) -> None:
    """Rank ``rank`` of a 2-rank data-parallel run (same batches on both replicas), recorded
    as torchrun's launch ``launch`` would (its ``TORCHELASTIC_RUN_ID``)."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", launch)
    torch.manual_seed(0)
    rec = Recorder(root, mode="stats", layout={"dp": 2, "rank": rank}, overwrite=overwrite)
    _loop(rec, torch.nn.Linear(4, 2), range(2))
    rec.close()


def test_a_step_whose_ranks_come_from_two_launches_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 of a rerun (``overwrite=True``, a new launch) has replaced its folders; rank 1
    has not yet: each rank's steps are one run, but step 0's ranks are two launches."""
    for rank in (0, 1):
        _rank_run(tmp_path / "base", rank, monkeypatch, "launch-a")
        _rank_run(tmp_path / "run", rank, monkeypatch, "launch-b")
    assert set(_ids(tmp_path / "run", LAUNCH_ID_KEY).values()) == {"launch-b"}
    assert _compare(tmp_path / "base", tmp_path / "run", capsys)[0] == 0
    _rank_run(tmp_path / "run", 0, monkeypatch, "launch-c", overwrite=True)
    code, err = _compare(tmp_path / "base", tmp_path / "run", capsys)
    assert code == 2, err
    assert err.startswith(
        f"precalign: error: {tmp_path / 'run' / 'step0'}: {MIXED_LAUNCHES} (rank0 from launch-c; rank1 from launch-b)"
    ), err


def test_without_a_launcher_no_launch_id_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's value without a rendezvous id
    root = record(tmp_path / "run", mode="scalars", steps=1)
    assert _ids(root, LAUNCH_ID_KEY) == {"step0/rank0": None}


# -- a tensor file loaded lazily is the file that was checked ----------------------------------


def _other_shard_bytes(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    return bytes(data)


@pytest.mark.parametrize(
    ("fmt", "how"),
    [
        ("native", "array"),
        pytest.param("native", "tensor", marks=SLOW),
        pytest.param("msprobe", "array", marks=SLOW),
        ("msprobe", "tensor"),
    ],
)
def test_a_tensor_file_changed_after_the_check_is_refused_when_loaded(
    fmt: str, how: str, tmp_path: Path
) -> None:
    """The folder is read (its checksums checked), then a tensor file is rewritten in place
    before the compare loads it: the load refuses it, naming the file."""
    from pytest_precalign.msprobe import read_msprobe_dump
    from pytest_precalign.trace.native_io import read_trace

    root = record(tmp_path / "run", mode="tensor", fmt=fmt, steps=1)
    folder = root / "step0" / "rank0"
    trace = read_trace(folder) if fmt == "native" else read_msprobe_dump(folder)
    key = next(iter(trace.tensors))
    files = sorted(folder.rglob("*.safetensors" if fmt == "native" else "*.pt"))
    file = files[0] if fmt == "native" else folder / "dump_tensor_data" / key
    file.write_bytes(_other_shard_bytes(file))  # same size, one byte changed: a write in place
    load = trace.tensors.array if how == "array" else trace.tensors.__getitem__  # type: ignore[attr-defined]
    changed = LOADED_CHANGED.replace("(", "[(]")
    with pytest.raises(TraceError, match=f"^{file}: (cannot read tensor '{key}': )?{changed}"):
        load(key)


def test_a_folder_republished_before_a_lazy_load_is_refused(tmp_path: Path) -> None:
    """A rerun re-publishes the rank folder (a new write of the same run's numbers) after the
    compare read it and before it loads a tensor: the shard found then is another file."""
    from pytest_precalign.trace.native_io import read_trace

    folder = record(tmp_path / "run", mode="tensor", steps=1) / "step0" / "rank0"
    again = record(tmp_path / "again", mode="tensor", steps=1) / "step0" / "rank0"
    trace = read_trace(folder)
    key = next(iter(trace.tensors))
    tmp = temp_dir_beside(folder)
    shutil.copytree(again, tmp, dirs_exist_ok=True)
    publish_dir(tmp, folder)
    with pytest.raises(TraceError, match=LOADED_CHANGED.replace("(", "[(]")):
        trace.tensors.array(key)  # type: ignore[attr-defined]
    assert read_trace(folder).tensors.array(key).shape  # type: ignore[attr-defined]  # read again: fine


# -- msprobe's own tools on our dumps, checksums.json and our manifest beside them -------------


@pytest.mark.slow
@needs_msprobe
def test_msprobes_own_compare_and_graph_read_our_sealed_dumps(tmp_path: Path) -> None:
    """A Recorder run in msprobe's format (tensor task, 2 steps) keeps ``checksums.json`` and
    ``precalign_manifest.json`` in each rank folder; msprobe's ``compare`` (step folders, the
    layout it takes) and ``graph_visualize`` (a step folder and the whole root) read them as
    they read msprobe's own dumps, with no error logged."""
    import subprocess

    from pytest_precalign.trace.checksums import CHECKSUM_FILE

    base = record(tmp_path / "base", mode="tensor", fmt="msprobe", steps=2)
    cand = record(tmp_path / "cand", mode="tensor", fmt="msprobe", steps=2, nan_at=1)
    assert (base / "step0" / "rank0" / CHECKSUM_FILE).is_file()
    text = msprobe_compare(cand / "step0", base / "step0", tmp_path / "out")
    assert "Module.0.Linear.forward.0.output.0" in text and CHECKSUM_FILE not in text
    for golden, target in ((base / "step1", cand / "step1"), (base, cand)):
        out = tmp_path / f"graph-{golden.name}"
        out.mkdir()
        done = subprocess.run(
            ["msprobe", "graph_visualize", "-tp", str(target), "-gp", str(golden), "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-3000:]
        assert [line for line in log.splitlines() if "[ERROR]" in line and "CANN" not in line] == []
        assert len(list(out.glob("*.vis.db"))) == 1, log[-3000:]
