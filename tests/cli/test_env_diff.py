"""``precalign env-diff A B``: the environments of two recorded runs (msprobe's config_check, for
our manifests): exit 0 when the same, 1 when something differs (each difference one line), 2 on
bad input. On real runs recorded by ``precalign record``; the same diff heads ``precalign
compare``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pytest_precalign.cli import main
from tests.helpers.files import reseal
from tests.helpers.nets import write_mlp_suite
from tests.helpers.paths import REPO


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One config recorded three times: twice alike, once with another thread count, another
    numerics environment variable and another input seed."""
    folder = tmp_path_factory.mktemp("env_diff")
    config = write_mlp_suite(folder)
    runs = {}
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
        for name in ("a", "b"):
            assert main(["record", str(config), "--out", str(folder / name)]) == 0
            runs[name] = folder / name / "port"
        mp.setenv("CUDA_LAUNCH_BLOCKING", "1")
        config.write_text(config.read_text().replace("seed: 3", "seed: 4"), encoding="utf-8")
        torch.set_num_threads(threads + 1)
        try:
            assert main(["record", str(config), "--out", str(folder / "c")]) == 0
        finally:
            torch.set_num_threads(threads)
        runs["c"] = folder / "c" / "port"
    return runs


def test_two_runs_recorded_alike_are_the_same(
    recorded: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["env-diff", str(recorded["a"]), str(recorded["b"] / "manifest.json")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("environment: the same in "), out
    assert f"torch {torch.__version__}" in out[0]


def test_each_difference_is_one_line(recorded: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    assert main(["env-diff", str(recorded["a"]), str(recorded["c"])]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(f"environment: {len(lines) - 1} difference(s) from ")
    assert set(lines[1:]) >= {
        f"  torch threads {threads} → {threads + 1}",
        "  numerics.env.CUDA_LAUNCH_BLOCKING unset → 1",
    }, lines
    assert any(line.startswith("  config digest ") for line in lines), lines
    assert any(line.startswith("  inputs digest ") for line in lines), lines
    # Nothing else moved: versions, device, dtype, determinism and the weights are the same.
    assert len(lines) == 5, lines


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("missing", "no recorded run there (expected a trace folder or its manifest.json)"),
        ("msprobe", "an msprobe dump carries no manifest: its environment was not recorded"),
        (
            "not-json",
            "not a readable manifest: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        ("deep-json", "not a readable manifest: nested too deeply"),
        ("binary", "a binary file (NUL bytes); expected a manifest"),
        ("huge", f"{(1 << 30) + 1} bytes; expected a manifest of at most 1024 MiB"),
        ("other-json", "not a pytest-precalign manifest (no 'versions')"),
    ],
)
def test_bad_input_is_one_message_and_exit_2(
    recorded: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, message: str
) -> None:
    bad = tmp_path / what
    if what == "msprobe":
        shutil.copytree(REPO / "tests" / "data" / "msprobe" / "tiny_statistics_L0", bad)
    elif what != "missing":
        bad.mkdir()
        if what == "huge":  # sparse: the size is refused before anything is read
            with open(bad / "manifest.json", "wb") as handle:
                handle.truncate((1 << 30) + 1)
        else:
            texts = {"not-json": "{", "deep-json": "[" * 100_000 + "]" * 100_000, "other-json": '{"a": 1}'}
            texts["binary"] = '{"versions": "\0"}'
            (bad / "manifest.json").write_text(texts[what], encoding="utf-8")
            reseal(bad / "manifest.json")
    assert main(["env-diff", str(recorded["a"]), str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    named = bad if what in ("missing", "msprobe") else bad / "manifest.json"
    assert captured.err.strip().splitlines() == [f"precalign: error: {named}: {message}"]


def test_compare_is_headed_by_the_environment_diff(
    recorded: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    main(["compare", str(recorded["a"]), str(recorded["c"])])
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("environment: "))
    assert "difference(s)" in out[start] and "  numerics.env.CUDA_LAUNCH_BLOCKING unset → 1" in out
    assert main(["compare", str(recorded["a"]), str(recorded["b"])]) == 0
    assert any(line.startswith("environment: the same in ") for line in capsys.readouterr().out.splitlines())
    dump = REPO / "tests" / "data" / "msprobe" / "tiny_statistics_L0"
    main(["compare", str(dump), str(dump)])
    assert "environment: not compared (an msprobe dump carries no manifest" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("before", "after", "line"),
    [(None, "2.13.0", "absent → 2.13.0"), ("2.12.0", "2.13.0", "2.12.0 → 2.13.0")],
    ids=["installed", "upgraded"],
)
def test_a_torch_npu_change_is_named(
    recorded: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    before: str | None,
    after: str,
    line: str,
) -> None:
    """Two manifests as ``precalign record`` wrote them, differing only in torch_npu's version
    (one machine has no torch_npu, or another release of it): the diff is that one line, and
    ``precalign compare`` of the two runs is headed by it."""
    runs = {}
    for name, version in (("old", before), ("new", after)):
        runs[name] = tmp_path / name
        shutil.copytree(recorded["a"], runs[name])
        manifest = json.loads((runs[name] / "manifest.json").read_text(encoding="utf-8"))
        assert "torch_npu" in manifest["versions"]  # recorded, installed or not
        manifest["versions"]["torch_npu"] = version
        (runs[name] / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        reseal(runs[name] / "manifest.json")
    assert main(["env-diff", str(runs["old"]), str(runs["new"])]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[1:] == [f"  torch_npu {line}"], out
    main(["compare", str(runs["old"]), str(runs["new"])])
    shown = capsys.readouterr().out.splitlines()
    start = next(i for i, text in enumerate(shown) if text.startswith("environment: "))
    assert (
        shown[start].startswith("environment: 1 difference(s)") and shown[start + 1] == f"  torch_npu {line}"
    )
