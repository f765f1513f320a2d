"""Errors that are not ours keep the contract: a user model that raises, a full disk. In the CLI
one message and exit 2; in pytest one line per item, the case run once, and report.json has an
entry with the error. The full disk is a real 256 KiB tmpfs (root on Linux; else skipped,
saying why)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The plugin's report header imports torch: imported before any in-process run, it stays loaded.
import torch  # noqa: F401

from pytest_precalign.cli import main
from tests.helpers.nets import write_mlp_suite

RAISES = """
import torch

class Net(torch.nn.Module):
    def __init__(self, boom=False):
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.head = torch.nn.Linear(4, 8)
        self.boom = boom

    def forward(self, input_ids):
        with open("calls.txt", "a") as calls:  # how often each side ran, across items
            calls.write(f"{self.boom} ")
        h = self.embed(input_ids)
        if self.boom:
            raise RuntimeError("out of memory in the user's forward")
        return self.head(h)


def build(**kw):
    return Net(**kw)
"""

CONFIG = """
version: 1
models:
  base: {source: factory, factory: "raising_nets:build"}
  cand: {source: factory, factory: "raising_nets:build", kwargs: {boom: true}}
inputs:
  toks: {kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}
cases:
  - {name: c1, baseline: base, candidate: cand, inputs: toks, phases: [forward, backward, step]}
"""


_RAISE_LINE = (
    RAISES.splitlines().index('            raise RuntimeError("out of memory in the user\'s forward")') + 1
)


@pytest.fixture
def raising_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)  # calls.txt lands here
    (tmp_path / "raising_nets.py").write_text(RAISES, encoding="utf-8")
    (tmp_path / "align.yaml").write_text(CONFIG, encoding="utf-8")
    yield tmp_path
    sys.modules.pop("raising_nets", None)


def test_a_model_that_raises_is_one_cli_message(
    raising_suite: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(raising_suite / "align.yaml")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"precalign: error: {raising_suite / 'align.yaml'}: case 'c1': the run raised RuntimeError: out of "
        f"memory in the user's forward (at {raising_suite / 'raising_nets.py'}:{_RAISE_LINE}, in forward)"
    ]


def test_a_model_that_raises_is_one_line_per_item_and_runs_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(raising_nets=RAISES)
    pytester.makefile(".yaml", align=CONFIG)
    result = pytester.runpytest_inprocess(
        "--align-config", "align.yaml", "--align-report", "out", "-p", "no:cacheprovider",
        f"--basetemp={pytester.path / 'bt'}", "-rN",
    )  # fmt: skip
    # -rN: pytest's own short summary repeats each message, cut to the terminal's width unless
    # CI is set (so the count below would depend on the environment); ours is counted.
    result.assert_outcomes(failed=3)
    text = result.stdout.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text
    message = "case 'c1': the run raised RuntimeError: out of memory in the user's forward (at "
    assert text.count(message) == 3 + 3  # each item's failure, then its summary line
    # The case ran once for its three phase items: the baseline once, the candidate once.
    assert (pytester.path / "calls.txt").read_text().split() == ["False", "True"]
    entries = json.loads((pytester.path / "out" / "report.json").read_text())["cases"]
    assert sorted(e["phase"] for e in entries) == ["backward", "forward", "step"]
    assert all(e["passed"] is False and message in e["error"] for e in entries)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a trace of the MLP suite does not fit."""
    if not sys.platform.startswith("linux"):
        pytest.skip("a tmpfs mount: Linux only")
    folder = tmp_path / "full"
    folder.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and mount): {exc}")
    yield folder
    subprocess.run(["umount", str(folder)], check=False, capture_output=True)


def test_save_traces_on_a_full_disk_prints_the_verdicts_first_and_leaves_nothing(
    tmp_path: Path, full_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_mlp_suite(tmp_path)
    try:
        code = main(["run", str(config), "--save-traces", str(full_disk)])
    finally:
        sys.modules.pop("nets", None)
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "PASSED port[forward]" in out and "PASSED port[step]" in out
    assert err.splitlines() == [
        f"precalign: error: {full_disk / 'align' / 'port'}: cannot save the traces: No space left on device"
    ]
    assert list(full_disk.iterdir()) == []  # no empty folders, no partial trace
