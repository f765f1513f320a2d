"""Dataset files (``kind: dataset``) are untrusted (issue #34 item 3): read as bytes, only the
rows a case needs, each bad file one message naming the YAML key, the file, its line and the
row -- exit 2 from ``precalign validate``, a usage error through pytest (it was a
UnicodeDecodeError traceback, an INTERNALERROR, "file not found" for a FIFO, and a token id of
10**30 accepted until torch's "Overflow when unpacking long long").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_precalign
from pytest_precalign.cli import main

SRC = Path(pytest_precalign.__file__).resolve().parents[1]  # the package under test

NET = """import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
"""

CONFIG = """version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  plain: {source: factory, factory: "dataset_tiny_net:build"}
inputs:
  rows:
    kind: dataset
    path: FILE
    batch: 2
cases:
  - {name: two_steps, baseline: plain, candidate: plain, inputs: rows, steps: 2,
     phases: [forward, backward, step], loss: mean}
"""


def _suite(folder: Path, name: str, content: bytes | None) -> Path:
    (folder / "dataset_tiny_net.py").write_text(NET)
    if content is not None:
        (folder / name).write_bytes(content)
    config = folder / "align.yaml"
    config.write_text(CONFIG.replace("FILE", name))
    return config


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


GOOD_ROWS = b"1 2 3\n4 5 6\n7 8 9\n1 1 1\n"


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("rows.txt", b"1 2 3\n\x00\x01\x02 binary\n", "rows.txt:2: row 2: a binary file (NUL byte)"),
        (
            "rows.txt",
            "1 2 3\ncaf\u00e9 4 5\n".encode("latin-1"),
            "rows.txt:2: row 2: not UTF-8 text (byte 0xe9 at column 4); expected a row of token ids",
        ),
        (
            "rows.txt",
            b"1 2 3\n\n4 5 " + str(10**30).encode() + b"\n",
            "rows.txt:3: row 2: token id 1000000000000000000000000000000 is beyond int64 "
            "(token ids are 0..9223372036854775807)",
        ),
        (
            "rows.jsonl",
            b"[1, 2, 3]\n[4, 5, " + b"7" * 5000 + b"]\n",
            "rows.jsonl:2: row 2: token id 77777777777777777777... (5000 digits) is beyond int64",
        ),
        (
            "rows.txt",
            b"1 2 3\n4 5 6\n7 8 9\n1 1.5 1\n",
            "rows.txt:4: row 4: expected a row of token ids >= 0 (ids separated by spaces, e.g. 1 2 3), "
            "got '1 1.5 1'",
        ),
    ],
)
def test_a_bad_dataset_is_one_message_naming_file_line_and_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, says: str
) -> None:
    config = _suite(tmp_path, name, content)
    assert main(["validate", str(config)]) == 2
    line = _one_error(capsys)
    assert f"{tmp_path / name}:" in line and says in line, line
    assert f"{config}:" in line  # and the config's line


def test_a_fifo_or_a_directory_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _suite(tmp_path, "rows.txt", None)
    os.mkfifo(tmp_path / "rows.txt")
    assert main(["validate", str(config)]) == 2  # and does not block on the FIFO
    assert _one_error(capsys).endswith(
        f"inputs.rows.path: {tmp_path / 'rows.txt'}: is a FIFO, expected a dataset of token rows (a regular file)"
    )
    (tmp_path / "rows.txt").unlink()
    (tmp_path / "rows.txt").mkdir()
    assert main(["validate", str(config)]) == 2
    assert _one_error(capsys).endswith(
        f"inputs.rows.path: {tmp_path / 'rows.txt'}: is a directory, expected a dataset of token rows (a regular file)"
    )


def test_a_bad_row_beyond_what_the_case_needs_does_not_matter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two steps of batch 2 read four rows: a fifth row is never read, so never judged."""
    config = _suite(tmp_path, "rows.txt", GOOD_ROWS + b"\xff\xfe not read\n")
    assert main(["validate", str(config)]) == 0, capsys.readouterr().err
    config.write_text(config.read_text().replace("steps: 2", "steps: 3"))
    assert main(["validate", str(config)]) == 2
    assert "rows.txt:5: row 5: not UTF-8 text (byte 0xff at column 1)" in _one_error(capsys)


def test_a_binary_dataset_through_pytest_is_a_usage_error(tmp_path: Path) -> None:
    _suite(tmp_path, "rows.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_precalign", "--align-config", "align.yaml", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(tmp_path)])},
        check=False,
    )
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]  # pytest's usage error
    assert "INTERNALERROR" not in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert "rows.txt:1: row 1: not UTF-8 text (byte 0x89 at column 1)" in done.stderr


def _peak_validate_mb(config: Path) -> float:
    code = (
        "import sys\n"
        "from pytest_precalign.cli import main\n"
        "code = main(['validate', sys.argv[1]])\n"
        "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(config.parent)])},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1]) / 1024


def test_validate_on_a_100_mb_dataset_holds_only_the_rows_a_two_step_case_needs(tmp_path: Path) -> None:
    """Acceptance: ``precalign validate`` of a 2-step case on a 100 MB dataset peaks (RSS) as
    it does on a 4-row one, within 25 MB (it read the whole file: 113 MB peaked at 1.27 GB)."""
    (tmp_path / "small").mkdir()
    (tmp_path / "big").mkdir()
    small = _suite(tmp_path / "small", "rows.txt", GOOD_ROWS)
    big = _suite(tmp_path / "big", "rows.txt", None)
    row = b" ".join(str(i % 16).encode() for i in range(512)) + b"\n"
    with (tmp_path / "big" / "rows.txt").open("wb") as f:
        f.write(row * (100_000_000 // len(row) + 1))
    assert (tmp_path / "big" / "rows.txt").stat().st_size > 100_000_000
    base, peak = _peak_validate_mb(small), _peak_validate_mb(big)
    assert peak - base < 25, f"validate peaked at {peak:.0f} MB on 100 MB, {base:.0f} MB on 4 rows"
