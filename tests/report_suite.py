"""A tiny alignment suite for the report tests: one aligned case, one broken case and one whose
break is expected, over a small MLP stack (no downloads, a few seconds to run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

NETS_PY = """
import torch


class Block(torch.nn.Module):
    def __init__(self, width, bug=False):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(2 * width, width)
        self.bug = bug

    def forward(self, x):
        h = self.down(self.act(self.up(self.norm(x))))
        if self.bug:
            h = h + 0.25         # the block's own code: blocks.1 is the origin
        return x + h


class Net(torch.nn.Module):
    def __init__(self, vocab=50, width=16, depth=3, bug_block=None):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(Block(width, i == bug_block) for i in range(depth))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(**kwargs):
    return Net(**kwargs)


class Crash(Net):
    def forward(self, input_ids):
        import os

        os._exit(3)              # a process dying mid-case (think: killed for memory)


def crash():
    return Crash()
"""

CONFIG = """
version: 1
models:
  ref: {source: factory, factory: "nets:build"}
  same: {source: factory, factory: "nets:build"}
  cand: {source: factory, factory: "nets:build", kwargs: {bug_block: 1}}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}
tolerances:
  tight:
    - {match: "*", atol: 1.0e-6, rtol: 1.0e-5, why: "fp32 same-code budget"}
cases:
  - {name: clean, baseline: ref, candidate: same, inputs: toks, phases: [forward, backward],
     record: {mode: tensor}, tolerances: tight}
  - {name: broken, baseline: ref, candidate: cand, inputs: toks, phases: [forward, backward],
     record: {mode: tensor}, tolerances: tight}
  - {name: known, baseline: ref, candidate: cand, inputs: toks, phases: [forward, backward],
     record: {mode: tensor}, tolerances: tight,
     expect: {phase: forward, first_divergence: blocks.1, origin: true}}
"""

# item -> (outcome, verdict) when the suite runs
EXPECTED = {
    "clean[forward]": ("passed", "passed"),
    "clean[backward]": ("passed", "passed"),
    "broken[forward]": ("failed", "failed"),
    "broken[backward]": ("failed", "failed"),
    "known[forward]": ("passed", "expected divergence"),
    "known[backward]": ("passed", "expected divergence"),
}


def make_suite(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(nets=NETS_PY)
    return pytester.makefile(".yaml", align=CONFIG)


def load_report(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "report.json").read_text())
    return data
