"""Mapping rules must bite, end to end: a case whose mapping has a rule that applied
to nothing, or a transform that does not fit the shapes, fails its items with one line naming
the mapping file:line, never a traceback."""

from __future__ import annotations

import pytest

from tests.helpers.runs import RunPytest

NETS = """
import torch


class Base(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)
        self.gate = torch.nn.Linear(4, 3)
        self.up = torch.nn.Linear(4, 3)
        self.out = torch.nn.Linear(3, 2)

    def forward(self, input_ids):
        h = self.emb(input_ids)
        return self.out(self.gate(h) * self.up(h))


class Fused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)
        self.fc1 = torch.nn.Linear(4, 6)
        self.proj = torch.nn.Linear(3, 2)

    def forward(self, input_ids):
        gate, up = self.fc1(self.emb(input_ids)).split(3, dim=-1)
        return self.proj(gate * up)
"""

MAPPING = """\
renames:
  - {baseline: out, candidate: proj}
tensors:
  - baseline: [gate.weight, up.weight]
    candidate: fc1.weight
    transform: {op: concat, dim: 0}
  - baseline: [gate.bias, up.bias]
    candidate: fc1.bias
    transform: {op: concat, dim: 0}
  - baseline: [gate, up]
    candidate: fc1
    kinds: [activation, grad_output]
    transform: {op: concat, dim: 2}
"""

CONFIG = """\
version: 1
models:
  base: {source: factory, factory: "nets:Base"}
  fused: {source: factory, factory: "nets:Fused"}
inputs:
  toks: {kind: tokens, batch: 1, seq_len: 3, vocab_size: 8}
cases:
  - {name: good, baseline: base, candidate: fused, inputs: toks, loss: mean, mapping: good.yaml,
     phases: [forward, backward], record: {mode: tensor}}
  - {name: no_kinds, baseline: base, candidate: fused, inputs: toks, loss: mean, mapping: no_kinds.yaml,
     phases: [forward, backward], record: {mode: tensor}}
  - {name: bad_shape, baseline: base, candidate: fused, inputs: toks, loss: mean, mapping: bad_shape.yaml,
     phases: [forward, backward], record: {mode: tensor}}
  - {name: optional, baseline: base, candidate: fused, inputs: toks, loss: mean, mapping: optional.yaml,
     phases: [forward], record: {mode: tensor}}
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(nets=NETS)
    files = {
        "align.yaml": CONFIG,
        "good.yaml": MAPPING,
        "no_kinds.yaml": MAPPING.replace("    kinds: [activation, grad_output]\n", ""),
        "bad_shape.yaml": MAPPING.replace(
            "{op: concat, dim: 2}", "[{op: concat, dim: 2}, {op: reshape, shape: [99]}]"
        ),
        "optional.yaml": MAPPING
        + "  - {baseline: gate, candidate: fc2, kinds: [activation], transform: [], optional: true}\n",
    }
    for name, text in files.items():
        (pytester.path / name).write_text(text, encoding="utf-8")
    return pytester


def test_rules_that_apply_to_nothing_and_misfit_transforms_fail_their_items_in_one_line(
    suite: pytest.Pytester, run_pytest: RunPytest
) -> None:
    result = run_pytest("--align-config", "align.yaml", "-rA")
    text = result.stdout.str()
    result.assert_outcomes(passed=3, failed=4)
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    no_kinds = (
        f"{suite.path / 'no_kinds.yaml'}:10: tensors rule 'fc1' matched no record or parameter "
        "(kinds [param]; did you mean kinds: [activation, grad_input, grad_output, input]?)"
    )
    bad_shape = (
        f"{suite.path / 'bad_shape.yaml'}:10: tensors rule 'fc1': the transform does not fit "
        "fc1 (activation, out, step 0): candidate shape (1, 3, 6), baseline shape (1, 3, 3), (1, 3, 3) ("
    )
    for case, message in (("no_kinds", no_kinds), ("bad_shape", bad_shape)):
        for phase in ("forward", "backward"):
            assert any(line.startswith(f"FAILED align.yaml::{case}[{phase}]") for line in result.outlines), (
                text
            )
            # The item's report section is the message and nothing else: one line.
            header = next(i for i, line in enumerate(result.outlines) if f"_ {case}[{phase}] _" in line)
            body = []
            for line in result.outlines[header + 1 :]:
                if line.startswith(("_", "=")):
                    break
                if not line.startswith("[gw"):  # xdist names the worker that ran the item
                    body.append(line)
            assert body == [body[0]] and body[0].startswith(message), body
    for line in ("PASSED good[forward]", "PASSED good[backward]", "PASSED optional[forward]"):
        assert any(out.startswith(line) for out in result.outlines), text
