"""A tiny alignment suite for the report tests: one aligned case, one broken case and one whose
break is expected, over the small MLP stack of ``nets.MLP_NETS`` (a few seconds to run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.nets import MLP_NETS

CONFIG = """
version: 1
models:
  ref: {source: factory, factory: "nets:build"}
  same: {source: factory, factory: "nets:build"}
  cand: {source: factory, factory: "nets:build", kwargs: {bug: own, bug_block: 1}}
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
    pytester.makepyfile(nets=MLP_NETS)
    return pytester.makefile(".yaml", align=CONFIG)


def load_report(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "report.json").read_text())
    return data
