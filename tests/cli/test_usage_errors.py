"""Usage errors that once ended in a traceback and exit 1 (the "diverged" code) are one
message and exit 2 / pytest.UsageError (issue #26 item 12)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_precalign
from pytest_precalign.cli import main
from tests.helpers.paths import MSPROBE_DATA

DUMP = MSPROBE_DATA / "micro" / "base_micro_statistics_L0_statistics"
SRC = Path(pytest_precalign.__file__).resolve().parents[1]  # the package under test

CONFIG = """version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  plain: {source: factory, factory: "usage_tiny_net:build"}
inputs:
  tokens: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 16, seed: 1}
cases:
  - {name: tiny, baseline: plain, candidate: plain, inputs: tokens, phases: [forward], loss: none}
"""

NET = """import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "usage_tiny_net.py").write_text(NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "align.yaml"
    path.write_text(CONFIG)
    return path


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_record_out_is_a_file(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.txt"
    out.write_text("x")
    assert main(["record", str(config), "--out", str(out)]) == 2
    assert _one_error(capsys) == (
        f"precalign: error: --out: {out}: {out} is a file, not a directory "
        "(each case's baseline goes into a directory)"
    )


def test_report_where_nothing_can_be_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(DUMP), str(DUMP), "--report", "/proc/self/newdir"]) == 2
    assert _one_error(capsys) == (
        "precalign: error: --report: /proc/self/newdir: cannot write there (/proc/self is not writable)"
    )


def test_calibrate_out_is_a_directory(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chdir(tmp_path)
    assert main(["calibrate", "--config", str(config), "--out", "."]) == 2
    assert _one_error(capsys) == (
        "precalign: error: --out: . is a directory; expected the tolerance table YAML file to write"
    )


def test_closed_stdout_is_no_traceback() -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "pytest_precalign", "compare", str(DUMP), str(DUMP)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like ``| head -0``: the reader is gone before anything is printed
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 2, err
    assert err.strip() == "precalign: error: output closed before it was all written (broken pipe)"


def test_align_baseline_is_a_file(pytester: pytest.Pytester, config: Path) -> None:
    (pytester.path / "usage_tiny_net.py").write_text(NET)
    (pytester.path / "align.yaml").write_text(CONFIG)
    (pytester.path / "baselines").write_text("not a folder")
    result = pytester.runpytest_inprocess(
        "--align-config", "align.yaml", "--align-baseline", "baselines", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --align-baseline: baselines: baselines is a file, not a directory*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
