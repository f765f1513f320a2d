"""The noise-envelope lane (``envelope:``): the baseline run again with determinism off, each
per-step scalar's spread over those clean reruns measured, and the candidate judged against
``factor`` x that spread (never below the floor), ``steps_over`` steps allowed above it. A
clean candidate passes; logits scaled by 1 + 2e-5 at some steps (a grad norm 2e-5 off),
which the case's table passes, fail the envelope at their first step; ``steps_over`` forgives exactly that many
steps; bad ``envelope:`` settings are one message naming the file and the key."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.config.specs import AlignConfig
from pytest_precalign.errors import ConfigError
from pytest_precalign.reports.envelope_text import envelope_text
from pytest_precalign.reports.training_evidence_text import evidence_text
from pytest_precalign.reports.training_json import training_dict
from pytest_precalign.run.case import run_case
from pytest_precalign.run.outcome import CaseRun
from pytest_precalign.specs.envelope import EnvelopeSpec

NETS = """
import torch


class Net(torch.nn.Module):
    def __init__(self, faulty=()):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 16)
        self.up = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 50)
        self.faulty, self.calls = set(faulty), 0

    def forward(self, input_ids):
        out = self.head(torch.tanh(self.up(self.embed(input_ids))))
        self.calls += 1
        return out * (1 + 2e-5) if self.calls - 1 in self.faulty else out


def build(faulty=()):
    return Net(faulty)
"""

CASE = (
    "inputs: toks, phases: [forward, backward, step], steps: 6, tolerances: loose, "
    "optimizer: {lr: 1.0e-2, weight_decay: 0.1}"
)
CONFIG = f"""
version: 1
models:
  ref: {{source: factory, factory: "nets:build"}}
  at_3: {{source: factory, factory: "nets:build", kwargs: {{faulty: [3]}}}}
  at_3_4: {{source: factory, factory: "nets:build", kwargs: {{faulty: [3, 4]}}}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}}
tolerances:
  loose:
    - {{match: "*", atol: 1.0e-5, rtol: 1.0e-4}}
cases:
  - {{name: clean, baseline: ref, candidate: ref, {CASE}, envelope: {{reruns: 2, floor: 1.0e-6}}}}
  - {{name: table, baseline: ref, candidate: at_3, {CASE}}}
  - {{name: fault, baseline: ref, candidate: at_3, {CASE}, envelope: {{reruns: 1, floor: 1.0e-6}}}}
  - {{name: two_over, baseline: ref, candidate: at_3_4, {CASE}, envelope: {{reruns: 1, floor: 1.0e-6, steps_over: 1}}}}
  - {{name: two_allowed, baseline: ref, candidate: at_3_4, {CASE}, envelope: {{reruns: 1, floor: 1.0e-6, steps_over: 2}}}}
"""


@pytest.fixture
def config(tmp_path: Path) -> Iterator[AlignConfig]:
    (tmp_path / "nets.py").write_text(NETS)
    sys.path.insert(0, str(tmp_path))
    try:
        yield load_config(CONFIG, tmp_path / "align.yaml")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nets", None)


def _run(config: AlignConfig, name: str) -> CaseRun:
    return run_case(config, next(c for c in config.cases if c.name == name))


def test_a_clean_candidate_is_within_the_envelope(config: AlignConfig) -> None:
    run = _run(config, "clean")
    assert run.training is not None and run.training.passed and run.training.lane == "envelope"
    # CPU reruns of this tiny loop are bitwise equal: the envelope is 0 and the floor decides
    assert envelope_text(run.training.envelope).startswith(
        "2 clean rerun(s), widest spread per scalar: loss 0,"
    )
    assert training_dict(run.training)["envelope"] == envelope_text(run.training.envelope)


def test_the_envelope_fails_a_small_fault_the_table_passes(config: AlignConfig) -> None:
    table = _run(config, "table")
    assert table.training is not None and table.training.passed and table.training.lane == "approximate"
    run = _run(config, "fault")
    training = run.training
    assert training is not None and not training.passed and training.first is not None
    # the logits are scaled (a forward fault): the loss moved too, inside its tolerance, so the
    # grad norm past the envelope is told as forward-or-backward, not backward
    assert (training.first.step, training.first.what, training.first.origin) == (
        3,
        "forward_or_backward",
        "grad_norm",
    )
    assert "noise envelope: grad_norm spread 0 over 1 clean rerun(s) of the baseline" in evidence_text(
        training.first.evidence
    )
    assert "(max of 4 x spread, floor 1e-06 x |baseline|)" in evidence_text(training.first.evidence)
    assert "steps over it: 3 (steps_over allows 0)" in envelope_text(training.envelope)


def test_steps_over_forgives_exactly_that_many_steps(config: AlignConfig) -> None:
    over = _run(config, "two_over")
    assert over.training is not None and not over.training.passed and over.training.first is not None
    assert over.training.first.step == 3
    assert "steps over it: 3, 4 (steps_over allows 1)" in envelope_text(over.training.envelope)
    allowed = _run(config, "two_allowed")
    assert allowed.training is not None and allowed.training.passed, allowed.training
    assert "steps over it: 3, 4 (steps_over allows 2)" in envelope_text(allowed.training.envelope)


def test_envelope_settings_are_parsed(config: AlignConfig) -> None:
    case = next(c for c in config.cases if c.name == "two_over")
    assert case.training.envelope == EnvelopeSpec(reruns=1, factor=4.0, steps_over=1, floor=1e-6)
    assert next(c for c in config.cases if c.name == "table").training.envelope is None


BAD = """
version: 1
models:
  ref: {{source: factory, factory: "nets:build"}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}}
cases:
  - {{name: c, baseline: ref, candidate: ref, inputs: toks, phases: {phases}, steps: 3, envelope: {envelope}}}
"""


@pytest.mark.parametrize(
    ("phases", "envelope", "expected"),
    [
        (
            "[forward, backward, step]",
            "{rerun: 2}",
            "cases[0].envelope.rerun: unknown key 'rerun' (did you mean 'reruns'?",
        ),
        ("[forward, backward, step]", "{factor: 0}", "cases[0].envelope.factor: must be > 0"),
        ("[forward, backward, step]", "{reruns: 0}", "cases[0].envelope.reruns: must be >= 1"),
        ("[forward, backward, step]", "{steps_over: 3}", "cases[0].envelope.steps_over: must be < steps (3)"),
        ("[forward, backward, step]", "{floor: 0}", "cases[0].envelope.floor: must be > 0"),
        ("[forward, backward, step]", "2", "cases[0].envelope: expected a mapping"),
        ("[forward]", "{reruns: 2}", "cases[0].envelope: judges a training run's per-step scalars"),
    ],
)
def test_bad_envelope_settings_are_one_message(
    tmp_path: Path, phases: str, envelope: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(BAD.format(phases=phases, envelope=envelope), tmp_path / "align.yaml")
    message = str(excinfo.value)
    assert expected in message and str(tmp_path / "align.yaml") in message and "\n" not in message


def test_bad_envelope_is_exit_2_in_the_cli(tmp_path: Path) -> None:
    (tmp_path / "align.yaml").write_text(
        BAD.format(phases="[forward, backward, step]", envelope="{factor: -1}")
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_precalign", "validate", str(tmp_path / "align.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "align.yaml" in proc.stderr and "cases[0].envelope.factor" in proc.stderr
    assert "Traceback" not in proc.stderr
