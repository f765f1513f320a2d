"""--align-baseline with --align-report, serially and with xdist: every item (case[phase]) is
in report.json and in the terminal summary, for a baseline written now, compared and passing,
and compared and failing. (Workers used to write the baseline entries into their own session
state, which never reached the controller: report.json had "cases": [].)"""

from __future__ import annotations

import json

import pytest

from tests.helpers.runs import RunPytest

NETS = """
import torch


class Net(torch.nn.Module):
    def __init__(self, vocab=40, width=12, bug=0.0):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.mid = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)
        self.bug = bug

    def forward(self, input_ids):
        return self.head(self.mid(self.embed(input_ids)) + self.bug)


def build(**kwargs):
    return Net(**kwargs)
"""

CONFIG = """
version: 1
models:
  ref: {{source: factory, factory: "nets:build"}}
  cand: {{source: factory, factory: "nets:build", kwargs: {{bug: {bug}}}}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 5, vocab_size: 40, seed: 3, labels: true}}
tolerances:
  tight:
    - {{match: "*", atol: 1.0e-6, rtol: 1.0e-5, why: "fp32 same code"}}
cases:
  - {{name: port, baseline: ref, candidate: cand, inputs: toks, phases: [forward, backward],
     record: {{mode: tensor}}, tolerances: tight}}
"""

ITEMS = {"port[forward]", "port[backward]"}


def _summary(stdout: list[str]) -> set[str]:
    """The items named in the terminal summary's precalign section."""
    start = next(i for i, line in enumerate(stdout) if "precalign" in line and line.startswith("="))
    named = set()
    for line in stdout[start + 1 :]:
        if line.startswith("="):
            break
        named |= {item for item in ITEMS if f" {item}:" in line}
    return named


def test_every_baseline_item_is_reported(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(nets=NETS)
    steps = [("0.0", "written", 2, 0), ("0.0", "compared-pass", 0, 2), ("0.5", "compared-fail", 2, 0)]
    for bug, what, failed, passed in steps:
        pytester.makefile(".yaml", align=CONFIG.format(bug=bug))
        result = run_pytest("--align-config", "align.yaml", "--align-baseline", "bl", "--align-report", "out")
        result.assert_outcomes(failed=failed, passed=passed)
        cases = json.loads((pytester.path / "out" / "report.json").read_text())["cases"]
        assert {c["nodeid"].rpartition("::")[2] for c in cases} == ITEMS, what
        assert [c["passed"] for c in cases] == [not failed] * 2, what
        assert all(c["baseline"] for c in cases), what
        assert _summary(result.stdout.lines) == ITEMS, what
    assert all(c["first_divergence"] for c in cases)
