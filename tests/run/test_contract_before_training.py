"""The contract check before step 0 (run/contract_check.py): each side's trainer plans its run
from the built model before anything trains; a difference fails the case there, naming the
step, the parameter group and both values, with nothing trained; the plan made before
training is the one the trainer writes while training."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.config.specs import AlignConfig
from pytest_precalign.errors import CaseError
from pytest_precalign.reports.document import report_document
from pytest_precalign.reports.outcome import phase_outcome
from pytest_precalign.reports.run_pattern_text import pattern_text
from pytest_precalign.reports.text import PhaseReport
from pytest_precalign.reports.training_evidence_text import evidence_text
from pytest_precalign.run.case import run_case
from pytest_precalign.run.contract_check import planned_training
from pytest_precalign.run.outcome import CaseRun
from pytest_precalign.sources import build_model
from pytest_precalign.sources.inputs import build_inputs
from pytest_precalign.trace.training_record import TRAINING_KEY
from tests.run.test_hf_trainer import CONFIG as HF_CONFIG

NETS = """
import weakref

import torch

CALLS = [0]  # forward calls of every Net: none when nothing trained


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 16)
        self.up = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, input_ids):
        CALLS[0] += 1
        return self.head(self.norm(torch.tanh(self.up(self.embed(input_ids)))))


def build():
    return Net()


def build_lagging():
    '''A Net whose LambdaLR (only over its own parameters) is one step behind.'''
    net = Net()
    owned = {id(p): weakref.ref(p) for p in net.parameters()}  # ids are reused once freed
    original = torch.optim.lr_scheduler.LambdaLR.__init__

    def init(self, optimizer, lr_lambda, *args, **kwargs):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if any((ref := owned.get(id(p))) is not None and ref() is p for p in params):
            inner = lr_lambda
            lr_lambda = lambda s: inner(max(s - 1, 0))
        original(self, optimizer, lr_lambda, *args, **kwargs)

    torch.optim.lr_scheduler.LambdaLR.__init__ = init
    return net
"""

OPTIMIZER = (
    "{name: adamw, lr: 1.0e-3, weight_decay: 0.1, clip_grad: 1.0, micro_batches: 2, "
    "schedule: {warmup_steps: 2, decay: cosine, min_lr: 1.0e-4}}"
)
CASE = "inputs: toks, phases: [forward, backward, step], steps: 4, optimizer: " + OPTIMIZER
CONFIG = f"""
version: 1
models:
  ref: {{source: factory, factory: "nets:build"}}
  lagging: {{source: factory, factory: "nets:build_lagging"}}
inputs:
  toks: {{kind: tokens, batch: 4, seq_len: 6, vocab_size: 50, seed: 3, labels: true}}
cases:
  - {{name: lagging, baseline: ref, candidate: lagging, {CASE}}}
  - {{name: lagging_expected, baseline: ref, candidate: lagging, {CASE},
     expect: {{step: 1, diverged: settings, origin: lr}}}}
  - {{name: dead_glob, baseline: ref, candidate: ref, inputs: toks, phases: [forward, backward, step],
     steps: 2, optimizer: {{name: adamw, lr: 1.0e-2, weight_decay: 0.1, no_decay: ["*.bias", "*layernorm*"]}}}}
"""


@pytest.fixture
def suite(tmp_path: Path) -> Iterator[tuple[AlignConfig, ModuleType]]:
    (tmp_path / "nets.py").write_text(NETS)
    config = load_config(CONFIG, tmp_path / "align.yaml")
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop("nets", None)  # another test's nets.py, imported earlier in this worker
    import nets  # type: ignore[import-not-found]

    try:
        yield config, nets
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nets", None)


def _run(config: AlignConfig, name: str) -> CaseRun:
    return run_case(config, next(c for c in config.cases if c.name == name))


def _report(run: CaseRun, phase: str) -> PhaseReport:
    return PhaseReport.of_run(
        run, phase, defined_in="align.yaml", baseline="ref", candidate="c", reproduce="r"
    )


def test_a_contract_difference_fails_before_anything_trains(suite: tuple[AlignConfig, ModuleType]) -> None:
    config, nets = suite
    run = _run(config, "lagging")
    assert nets.CALLS[0] == 0  # no forward ran: nothing trained, nothing recorded
    assert run.baseline.records == () and run.candidate.records == ()
    training = run.training
    assert training is not None and training.first is not None and not training.passed
    first = training.first
    assert (first.step, first.what, first.origin, training.steps_compared) == (1, "settings", "lr", 0)
    assert "lr at step 1: 5.000e-04 vs 0.000e+00" in evidence_text(first.evidence)
    assert "baseline group 0, candidate group 0" in evidence_text(first.evidence)
    assert pattern_text(first.pattern) == "the candidate's schedule is 1 step(s) behind the baseline's"
    for phase in run.phases:
        outcome = phase_outcome(_report(run, phase))
        assert not outcome.passed
        assert outcome.message.startswith("Step 1 diverged first: settings, origin lr — the sides'"), (
            outcome.message
        )
        assert "Nothing was trained or recorded" in outcome.message
        assert outcome.summary == (
            f"FAILED lagging[{phase}]: 0 compared; nothing trained; step 1 diverged first: settings (lr)"
        )
    entry = phase_outcome(_report(run, "forward")).entry
    assert entry is not None
    document = json.loads(json.dumps(report_document([entry], {})))
    assert document["training"]["steps_compared"] == 0
    assert document["training"]["first_divergent"] == "settings"
    assert document["training"]["lane"] == "approximate"
    assert "lr at step 1" in document["training"]["evidence"]


def test_an_expected_contract_difference_passes_every_phase(suite: tuple[AlignConfig, ModuleType]) -> None:
    config, nets = suite
    run = _run(config, "lagging_expected")
    assert nets.CALLS[0] == 0
    outcomes = [phase_outcome(_report(run, phase)) for phase in run.phases]
    assert all(o.passed for o in outcomes)
    assert outcomes[0].summary == (
        "PASSED lagging_expected[forward]: 0 compared; nothing trained; step 1 diverged first: "
        "settings (lr); the expected divergence"
    )


def test_the_plan_before_training_is_the_one_each_trainer_writes(tmp_path: Path) -> None:
    config = load_config(HF_CONFIG, tmp_path / "align.yaml")  # loop vs transformers.Trainer
    case = config.cases[0]
    data = build_inputs(config.inputs[case.inputs], config.base_dir, case.steps)
    spec = config.models["a"]
    before = {
        side: planned_training(build_model(spec, config.base_dir), spec, data, case, side)
        for side in ("baseline", "candidate")
    }
    run = run_case(config, case)
    assert run.training is not None and run.training.passed
    for side, trace in (("baseline", run.baseline), ("candidate", run.candidate)):
        planned = before[side]
        assert planned is not None
        assert json.loads(json.dumps(planned.as_dict())) == json.loads(
            json.dumps(trace.manifest[TRAINING_KEY])
        )
    assert before["baseline"] is not None and before["baseline"].trainer == "loop"
    assert before["candidate"] is not None and before["candidate"].trainer == "hf_trainer"


def test_a_no_decay_glob_that_matches_nothing_fails_before_training(
    suite: tuple[AlignConfig, ModuleType],
) -> None:
    """Fail closed: a glob meant to exempt parameters from weight decay that exempts none (the
    net has no layernorm) would let the run decay what the user meant to exempt."""
    config, nets = suite
    with pytest.raises(CaseError) as info:
        _run(config, "dead_glob")
    message = str(info.value)
    assert "optimizer.no_decay: '*layernorm*' matches no parameter of either side" in message
    assert "embed.weight" in message  # names the parameters it looked at
    assert nets.CALLS == [0]  # nothing ran
