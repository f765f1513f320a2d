"""``isolate: true`` calls candidate modules again on the baseline's inputs: those extra calls
must leave the run as it was -- buffers (a step counter, BatchNorm's running statistics) and the
random generators restored -- or a model would fail against itself."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config_file
from pytest_precalign.run.case import run_case

NETS = """
import torch


class Counted(torch.nn.Module):
    \"\"\"Adds how often it ran to its output: a buffer the forward changes.\"\"\"

    def __init__(self, width):
        super().__init__()
        self.proj = torch.nn.Linear(width, width)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.proj(x) + self.calls


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.counted = Counted(8)
        self.norm = torch.nn.BatchNorm1d(4)  # train mode: running statistics move per call
        self.drop = torch.nn.Dropout(0.5)  # train mode: draws from the random generator
        self.head = torch.nn.Linear(8, 16)

    def forward(self, input_ids):
        h = self.norm(self.counted(self.embed(input_ids)))
        return self.head(self.drop(h))


def build():
    return Net()
"""

CONFIG = """
version: 1
models:
  a: {source: factory, factory: "stateful_nets:build"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 4, vocab_size: 16, labels: true}
tolerances:
  exact:
    - {match: "*", atol: 0, rtol: 0, why: "one model against itself"}
cases:
  - {name: self, baseline: a, candidate: a, inputs: toks, phases: [forward, backward, step], steps: 2,
     train: true, isolate: true, record: {mode: tensor}, tolerances: exact}
"""


@pytest.fixture
def suite(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "stateful_nets.py").write_text(NETS, encoding="utf-8")
    (tmp_path / "align.yaml").write_text(CONFIG, encoding="utf-8")
    yield tmp_path
    sys.modules.pop("stateful_nets", None)


def test_a_stateful_model_isolated_against_itself_is_aligned(suite: Path) -> None:
    config = load_config_file(suite / "align.yaml")
    run = run_case(config, config.case("self"))
    failed = {phase: v.first.name for phase, v in run.verdicts.items() if v.first is not None}
    assert failed == {}
    assert all(v.passed for v in run.verdicts.values())
    # Isolation did run (it is what could have disturbed the state).
    assert run.verdicts["forward"].isolated_count > 0
