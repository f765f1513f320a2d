"""A stored baseline whose weights no longer fit the model as configured now (its width changed
since it was recorded) is called stale, with the command that records it anew, not a
``weights.sync: shape mismatch``."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.baseline.store import check_case
from pytest_precalign.cli import main
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.errors import CaseError

NET = """
import torch


class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.embed = torch.nn.Embedding(50, width)
        self.head = torch.nn.Linear(width, 50)

    def forward(self, input_ids):
        return self.head(self.embed(input_ids))


def build(width=8):
    return Net(width)
"""

CONFIG = """
version: 1
models:
  net: {{source: factory, factory: "stale_net:build", kwargs: {{width: {width}}}}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 4, vocab_size: 50, seed: 3}}
cases:
  - {{name: fwd, baseline: net, candidate: net, inputs: toks, phases: [forward]}}
"""


def _write(folder: Path, width: int) -> Path:
    (folder / "stale_net.py").write_text(NET, encoding="utf-8")
    config = folder / "align.yaml"
    config.write_text(CONFIG.format(width=width), encoding="utf-8")
    return config


def test_a_stale_stored_baseline_is_called_stale_with_the_refresh_command(tmp_path: Path) -> None:
    config = _write(tmp_path, 8)
    assert main(["record", str(config), "--out", str(tmp_path / "bl")]) == 0
    _write(tmp_path, 12)  # the model's width changed since the baseline was recorded
    aligned = load_config_file(config)
    with pytest.raises(CaseError) as excinfo:
        check_case(aligned, aligned.case("fwd"), tmp_path / "bl", "none", run_id="now")
    message = str(excinfo.value)
    assert f"the stored baseline {tmp_path / 'bl' / 'fwd'} is stale" in message, message
    assert (
        f"record it anew with: precalign record {config} --out {tmp_path / 'bl'} --case fwd --overwrite"
        in message
    )
    assert "\n" not in message
    # the command it names works, and then the case compares
    assert main(["record", str(config), "--out", str(tmp_path / "bl"), "--case", "fwd", "--overwrite"]) == 0
    assert check_case(aligned, aligned.case("fwd"), tmp_path / "bl", "none", run_id="again").run is not None
