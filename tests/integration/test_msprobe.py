"""msprobe dumps end to end: a case gating two dumps of the fault corpus, and the plugin saving
its traces in msprobe's format."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from pytest_precalign.msprobe import read_msprobe_dump
from tests.helpers.msprobe_faults import S_L0, dumps
from tests.helpers.runs import RunPytest


def test_gate_on_dumps_declares_the_fault(
    corpus: Path, pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    """A case gating two dumps (``baseline: {dump: ...}``) passes only with the true layer."""
    golden, run = dumps(corpus, S_L0, "bf16_layer")
    pytester.makefile(
        ".yaml",
        align=textwrap.dedent(
            f"""\
            version: 1
            cases:
              - name: bf16_layer
                baseline: {{dump: {golden}}}
                candidate: {{dump: {run}}}
                phases: [forward]
                expect: {{phase: forward, first_divergence: model.layers.1.mlp.down_proj, origin: true}}
              - name: golden
                baseline: {{dump: {corpus / "b" / S_L0.label / "golden"}}}
                candidate: {{dump: {corpus / "a" / S_L0.label / "golden"}}}
                phases: [forward, backward]
            """
        ),
    )
    result = run_pytest("--align-config", "align.yaml")
    result.assert_outcomes(passed=3)
    assert os.path.isdir(run)


def test_plugin_saves_msprobe_dumps_with_record_format(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        nets="""
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.head = torch.nn.Linear(8, 20)

    def forward(self, input_ids):
        return self.head(self.embed(input_ids))

def build():
    return Net()
"""
    )
    pytester.makefile(
        ".yaml",
        align="""
version: 1
models:
  a: {source: factory, factory: "nets:build"}
  b: {source: factory, factory: "nets:build"}
inputs:
  t: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 20, labels: true}
cases:
  - {name: c, baseline: a, candidate: b, inputs: t, phases: [forward, backward],
     record: {mode: tensor, format: msprobe}}
""",
    )
    result = run_pytest("--align-config", "align.yaml", "--align-save-traces", "dumps")
    result.assert_outcomes(passed=2)
    dump = pytester.path / "dumps" / "align" / "c" / "candidate"
    trace = read_msprobe_dump(dump / "step0" / "rank0")
    assert {r.name for r in trace.records if r.kind == "activation"} == {"embed", "head"}
    assert (dump / "step0" / "rank0" / "dump_tensor_data").is_dir()
