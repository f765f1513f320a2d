"""Files from elsewhere are untrusted (issue #26 items 2, 4, 6, 13): real msprobe dumps
(tests/data/msprobe) and real HF checkpoints, each broken the way a hostile or damaged file
would be; every case ends in one message and exit 2, never a traceback, a hang, a file
outside the folder or a whole multi-GB read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch

import pytest_precalign
from pytest_precalign.cli import main
from pytest_precalign.compare.tolerances import load_table
from pytest_precalign.errors import ConfigError, TraceError
from pytest_precalign.msprobe import read_msprobe_dump
from tests.helpers.files import reseal
from tests.helpers.paths import MSPROBE_DATA

TENSOR_DUMP = MSPROBE_DATA / "micro" / "base_micro_tensor_L0_statistics"
STATS_DUMP = MSPROBE_DATA / "micro" / "base_micro_statistics_L0_statistics"
SRC = Path(pytest_precalign.__file__).resolve().parents[1]  # the package under test


def _copy(dump: Path, to: Path) -> Path:
    (rank,) = (dump / "step0").iterdir()
    target = to / "step0" / "rank0"
    shutil.copytree(rank, target)
    return target


def _set_first_data_name(rank: Path, name: str) -> str:
    """Point the first tensor entry's data_name at ``name``; returns the old name."""
    dump = json.loads((rank / "dump.json").read_text())
    first = next(iter(dump["data"].values()))["input_args"][0]
    old = first["data_name"]
    first["data_name"] = name
    (rank / "dump.json").write_text(json.dumps(dump))
    reseal(rank / "dump.json")
    return str(old)


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- item 2: names inside files stay inside their folder -----------------------------------


@pytest.mark.parametrize("kind", ["parent", "absolute", "nul"])
def test_data_name_outside_the_folder_is_refused(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = _copy(TENSOR_DUMP, tmp_path / "golden")
    target = _copy(TENSOR_DUMP, tmp_path / "target")
    outside = tmp_path / "outside.pt"
    old = _set_first_data_name(target, "x")
    shutil.copy(target / "dump_tensor_data" / old, outside)  # a real tensor file, out of the folder
    name = {"parent": "../../../outside.pt", "absolute": str(outside), "nul": "a\0b.pt"}[kind]
    _set_first_data_name(target, name)
    assert main(["compare", str(golden), str(target)]) == 2
    line = _one_error(capsys)
    assert f"{target / 'dump.json'}: record " in line and "data_name" in line
    assert "is not a plain file name" in line


def test_hf_weight_map_outside_the_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    outside = tmp_path / "outside"
    outside.mkdir()
    save_file({"w": torch.ones(2)}, str(outside / "model.safetensors"))
    for i, name in enumerate(["../outside/model.safetensors", str(outside / "model.safetensors")]):
        ckpt = tmp_path / f"ckpt{i}"
        ckpt.mkdir()
        (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": name}}))
        assert main(["check-weights", str(outside), str(ckpt)]) == 2
        line = _one_error(capsys)
        assert (
            f"{ckpt / 'model.safetensors.index.json'}: weight_map: " in line
            and "not a plain file name" in line
        )


# -- item 4: a FIFO never hangs the tool ------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``precalign ARGS`` in a subprocess, so that a hang fails the test instead of the suite."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "pytest_precalign", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)


def test_fifo_config_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "align.yaml"
    os.mkfifo(fifo)
    try:
        proc = _cli("validate", str(fifo))
    except subprocess.TimeoutExpired:
        pytest.fail(f"precalign validate hung on the FIFO {fifo}")
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        == f"precalign: error: {fifo}: is a FIFO, expected an alignment YAML file (a regular file)"
    )


@pytest.mark.parametrize("where", ["dump.json", "tensor"])
def test_fifo_is_refused_not_waited_on(where: str, tmp_path: Path) -> None:
    golden = _copy(TENSOR_DUMP, tmp_path / "golden")
    target = _copy(TENSOR_DUMP, tmp_path / "target")
    if where == "dump.json":
        fifo = target / "dump.json"
        fifo.unlink()
    else:
        first = next(iter(json.loads((target / "dump.json").read_text())["data"].values()))
        fifo = target / "dump_tensor_data" / first["input_args"][0]["data_name"]
        fifo.unlink()
    os.mkfifo(fifo)
    try:
        proc = _cli("compare", str(golden), str(target))
    except subprocess.TimeoutExpired:
        pytest.fail(f"precalign compare hung on the FIFO {fifo}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    if where == "dump.json":  # not a dump folder at all: the folder is named
        want = f"precalign: error: {target}: neither a pytest-precalign trace"
    else:
        want = f"precalign: error: {fifo}: is a FIFO, expected a regular file inside a recording folder"
    assert proc.stderr.startswith(want) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# -- item 6: size guards ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [1536 << 20, 64 << 20])
def test_huge_or_binary_dump_json_is_refused_before_it_is_read(
    size: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = _copy(STATS_DUMP, tmp_path / "golden")
    target = _copy(STATS_DUMP, tmp_path / "target")
    dump = target / "dump.json"
    dump.unlink()
    with dump.open("wb") as f:
        f.truncate(size)  # sparse: NUL bytes that take no disk
    tracemalloc.start()
    try:
        with pytest.raises(TraceError):
            read_msprobe_dump(target)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak  # refused before it is read: the old reader took 4.6 GB for 1.5 GB
    assert main(["compare", str(golden), str(target)]) == 2
    line = _one_error(capsys)
    want = (
        f"{size} bytes; expected a JSON file of at most 1024 MiB"
        if size > 1 << 30
        else "a binary file (NUL bytes)"
    )
    assert line == f"precalign: error: {dump}: " + want if size > 1 << 30 else want in line


# Nine levels of nine aliases: a few hundred bytes that stand for 9**9 strings.
ALIAS_BOMB = (
    "[[&a [lol, lol, lol, lol, lol, lol, lol, lol, lol], "
    + ", ".join(f"&{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    + "]]"
)


@pytest.mark.parametrize("key", ["kind", "phase", "dtype", "step"])
def test_yaml_alias_bomb_makes_a_short_message(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "tolerances.yaml"
    table.write_text(f"rules:\n  - {{match: '*', {key}: {ALIAS_BOMB}, atol: 1.0, rtol: 0.0}}\n")
    assert len(table.read_bytes()) < 500
    assert main(["compare", str(STATS_DUMP), str(STATS_DUMP), "--tolerances", str(table)]) == 2
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError):
            load_table(table, "--tolerances", tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # the aliases are never expanded: the old code built a 722 MB message
    line = _one_error(capsys)
    assert f"rules[0].{key}: expected " in line and len(line) < 600, len(line)


# -- item 13: duplicates and missing ranks are named ------------------------------------------


def test_duplicate_record_in_dump_json_is_refused(tmp_path: Path) -> None:
    rank = _copy(STATS_DUMP, tmp_path / "dump")
    text = (rank / "dump.json").read_text()
    data = json.loads(text)["data"]
    first = next(iter(data))
    entry = f'"{first}": {json.dumps(data[first])}'
    head, sep, tail = text.partition('"data": {')
    (rank / "dump.json").write_text(head + sep + entry + ", " + tail)  # the same key twice
    reseal(rank / "dump.json")
    assert len(read_msprobe_dump(STATS_DUMP).records) > 0
    with pytest.raises(TraceError) as info:
        read_msprobe_dump(rank)
    assert str(info.value) == (
        f"{rank / 'dump.json'}: key {first!r} appears twice in one object (each key once)"
    )


def test_missing_ranks_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (rank,) = (STATS_DUMP / "step0").iterdir()
    for side, count in (("golden", 20), ("target", 7)):
        for r in range(count):
            shutil.copytree(rank, tmp_path / side / "step0" / f"rank{r}")
    assert main(["compare", str(tmp_path / "golden"), str(tmp_path / "target")]) == 2
    line = _one_error(capsys)
    assert "20 in baseline" in line and "7 in candidate" in line
    assert "not in candidate: step0/rank7, step0/rank8" in line and "and 5 more" in line
    assert "not in baseline: none" in line and len(line) < 700


def test_a_tensor_file_swapped_after_its_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The msprobe tensor reader loads the file it checked (a regular file), not whatever the
    name points at when torch opens it: a swap between the check and the load is not read."""
    from pytest_precalign.msprobe.tensors import PtTensors

    folder = tmp_path / "dump_tensor_data"
    folder.mkdir()
    torch.save(torch.ones(3), folder / "a.pt")
    torch.save(torch.full((3,), 7.0), tmp_path / "other.pt")
    real_load = torch.load

    def swap_then_load(*args: object, **kwargs: object) -> object:
        os.replace(tmp_path / "other.pt", folder / "a.pt")  # the attacker wins the race
        return real_load(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "load", swap_then_load)
    loaded = PtTensors(folder, {"a.pt": (3,)})["a.pt"]
    assert torch.equal(loaded, torch.ones(3))
