"""Issue #47 (recordings committed to git), item 2: every folder our writers make carries
``checksums.json`` (sha256 of each file, written last), checked by every reader; a link or a
FIFO inside a recording folder is refused, never followed or opened; a recording replaced
while it is read is read as one version or refused. Real recordings (the ``Recorder`` on a
2-layer MLP, ``crafted_runs``), read through ``precalign compare`` in-process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from pytest_precalign._atomic import publish_dir, temp_dir_beside
from pytest_precalign.cli import main
from pytest_precalign.errors import CaseError, TraceError
from pytest_precalign.trace.checksums import CHECKSUM_FILE

from .crafted_runs import copied, record, shard

CHANGED = "content changed after it was recorded (sha256 "
RECORDINGS = {  # name: (mode, format)
    "scalars": ("scalars", "native"),
    "stats": ("stats", "native"),
    "hash": ("hash", "native"),
    "tensor": ("tensor", "native"),
    "msprobe-stats": ("stats", "msprobe"),
    "msprobe-tensor": ("tensor", "msprobe"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sealed")
    return {name: record(base / name, mode=m, fmt=f, steps=2) for name, (m, f) in RECORDINGS.items()}


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["compare", str(a), str(b)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = [line for line in captured.err.splitlines() if line.strip()]
    return code, lines[0] if len(lines) == 1 else captured.err


def _flip(path: Path, at: int = -1) -> None:
    """One byte of ``path`` changed (the last one by default), its size kept."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", list(RECORDINGS))
def test_every_writer_seals_each_step_folder_with_the_sha256_of_every_file(
    name: str, runs: dict[str, Path]
) -> None:
    for step in (0, 1):
        folder = runs[name] / f"step{step}" / "rank0"
        sums = json.loads((folder / CHECKSUM_FILE).read_text())
        files = {
            p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*")
            if p.is_file() and p.name != CHECKSUM_FILE
        }
        assert sums["algorithm"] == "sha256" and sums["files"] == files, folder
        assert len(files) >= 2 and not list(folder.rglob(".*"))  # no temp file left


def _damaged(runs: dict[str, Path], tmp_path: Path, name: str, file: str) -> tuple[Path, Path]:
    side = copied(runs[name], tmp_path / name)
    folder = side / "step1" / "rank0"
    target = shard(side, 1) if file == "shard" else next(folder.glob(file))
    _flip(target)
    return side, target


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("stats", "manifest.json"),
        pytest.param("stats", "index.json", marks=pytest.mark.slow),
        ("tensor", "shard"),
        ("msprobe-stats", "dump.json"),
        pytest.param("msprobe-stats", "construct.json", marks=pytest.mark.slow),
        ("msprobe-stats", "precalign_manifest.json"),
        ("msprobe-tensor", "dump_tensor_data/*.pt"),
    ],
)
def test_a_byte_changed_after_recording_is_named_by_the_compare(
    name: str, file: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    side, target = _damaged(runs, tmp_path, name, file)
    code, line = _compare(runs[name], side, capsys)
    assert code == 2 and line.startswith(f"precalign: error: {target}: {CHANGED}"), line


def test_a_file_added_or_removed_after_recording_is_named(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    side = copied(runs["stats"], tmp_path / "added")
    extra = side / "step0" / "rank0" / "notes.txt"
    extra.write_text("added later")
    code, line = _compare(runs["stats"], side, capsys)
    assert code == 2 and f"{extra}: not listed in {CHECKSUM_FILE}" in line, line
    side = copied(runs["msprobe-tensor"], tmp_path / "removed")
    gone = next((side / "step1" / "rank0" / "dump_tensor_data").iterdir())
    gone.unlink()
    code, line = _compare(runs["msprobe-tensor"], side, capsys)
    assert code == 2 and f"{gone}: listed in {CHECKSUM_FILE} but missing" in line, line


def test_a_recording_written_before_checksums_is_read_as_before(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    side = copied(runs["tensor"], tmp_path / "older")
    for sums in side.rglob(CHECKSUM_FILE):
        sums.unlink()
    assert _compare(runs["tensor"], side, capsys)[0] == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param({"format": "other"}, "not a pytest-precalign checksums file", marks=pytest.mark.slow),
        pytest.param(
            {"algorithm": "md5"}, "algorithm 'md5' is not supported (expected sha256)", marks=pytest.mark.slow
        ),
        ({"files": {"../../etc/passwd": "0" * 64}}, "'files' must map relative file names"),
        ({"files": {"manifest.json": "xyz"}}, "sha256 digests (64 lowercase hex digits)"),
        pytest.param({"publication": 3}, "'publication' must be a non-empty string", marks=pytest.mark.slow),
    ],
)
def test_a_crafted_checksums_file_is_one_message(
    body: dict[str, object],
    says: str,
    runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    side = copied(runs["stats"], tmp_path / "crafted")
    file = side / "step0" / "rank0" / CHECKSUM_FILE
    file.write_text(json.dumps({**json.loads(file.read_text()), **body}))
    code, line = _compare(runs["stats"], side, capsys)
    assert code == 2 and line.startswith(f"precalign: error: {file}: ") and says in line, line


@pytest.mark.parametrize("kind", ["link", "fifo", "link in dump_tensor_data"])
def test_a_link_or_fifo_inside_a_recording_folder_is_refused_never_opened(
    kind: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not part of the recording")
    name = "msprobe-tensor" if "dump_tensor_data" in kind else "stats"
    side = copied(runs[name], tmp_path / "side")
    folder = side / "step0" / "rank0" / ("dump_tensor_data" if "dump_tensor_data" in kind else "")
    entry = folder / "extra.json"
    if kind == "fifo":
        os.mkfifo(entry)  # opening it for reading would block the compare forever
        want = f"{entry}: is a FIFO, expected a regular file inside a recording folder"
    else:
        entry.symlink_to(outside)
        want = f"{entry}: a symbolic link inside a recording folder"
    code, line = _compare(runs[name], side, capsys)
    assert code == 2 and line.startswith(f"precalign: error: {want}"), line


def test_a_run_root_republished_between_step_reads_is_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun re-publishes the root (``overwrite=True``) after the compare read step 0 and
    before it reads step 1: deterministic, hooked between the step reads."""
    import pytest_precalign.parallel.sides as sides

    root = copied(runs["stats"], tmp_path / "root")
    real = sides.read_rank_folder
    reads: list[Path] = []

    def read_then_rerun(folder: Path):  # type: ignore[no-untyped-def]
        trace = real(folder)
        reads.extend([folder] if folder.is_relative_to(root) else [])
        if len(reads) == 1 and republish:  # the candidate's step 0 is read, step 1 is not yet
            record(root, mode="stats", steps=2, overwrite=True)
        return trace

    monkeypatch.setattr(sides, "read_rank_folder", read_then_rerun)
    republish = False
    assert _compare(runs["stats"], root, capsys)[0] == 0  # the same hook, no rerun: read as one version
    reads.clear()
    republish = True
    code, line = _compare(runs["stats"], root, capsys)
    assert code == 2 and "the recording changed while it was read" in line, line
    assert line.startswith(f"precalign: error: {root}: ") and line.endswith("run the compare again"), line


def test_a_trace_folder_republished_while_it_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pytest_precalign.trace.native_io as native_io

    one = record(tmp_path / "run", mode="stats", steps=1) / "step0" / "rank0"
    other = record(tmp_path / "rerun", mode="stats", steps=1) / "step0" / "rank0"  # a rerun's folder
    real = native_io.read_run_record

    def read_then_republish(*args):  # type: ignore[no-untyped-def]
        found = real(*args)
        tmp = temp_dir_beside(one)
        shutil.copytree(other, tmp, dirs_exist_ok=True)
        publish_dir(tmp, one)  # the writer's overwrite, between reading manifest.json and index.json
        return found

    monkeypatch.setattr(native_io, "read_run_record", read_then_republish)
    with pytest.raises(TraceError, match="the recording changed while it was read"):
        native_io.read_trace(one)


def test_the_megatron_trainers_evidence_is_redacted_atomic_and_checked(tmp_path: Path) -> None:
    from pytest_precalign.run.trainers.megatron import launched_evidence, write_evidence

    token = "hf_" + "a" * 34
    path = write_evidence(tmp_path, 0, {"training": {"settings": {"hub_token": token}}, "note": token})
    text = path.read_text()
    assert token not in text and "<redacted>" in text
    recorded = (tmp_path / f"{path.name}.sha256").read_text()
    assert recorded == f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, f"{path.name}.sha256"]  # no temp file
    _flip(path, 2)
    with pytest.raises(CaseError, match=f"{path}: {CHANGED.replace('(', '[(]')}"):
        launched_evidence(tmp_path, 1, None)
