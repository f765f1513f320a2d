"""Judge once: following a case from ``run_case`` through the code, ``run/`` enters ``verdict/``
only through its doors: ``verdict.case_facts.case_facts`` (the manifests read once, where
``finish`` starts), ``verdict.case_verdict.judge_case`` (once per judgment), and, before a
training run trains, ``verdict.case_verdict.judge_stopped`` (its plans judged directly, by the
one predicate the run verdict also judges at step 0); it gets every verdict back complete
(nothing returns from ``verdict/`` into ``run/`` to be finished there).

Every Python call is traced (``sys.setprofile``) while a real tiny case runs; a call whose code
is under ``verdict/`` made from a frame under ``run/`` is an entry, a return from one into
``run/`` a return. A case is judged once; a training run also on its plans before step 0 (the
contract check, no traces made nor ``finish`` run for it); a replayed one again with what the
replay found, after its replayed step was judged."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch

import pytest_precalign
from pytest_precalign.config.loader import load_config
from pytest_precalign.config.specs import AlignConfig
from pytest_precalign.reports.replay_text import replay_text
from pytest_precalign.run.case import run_case
from pytest_precalign.run.outcome import CaseRun
from tests.helpers.late_nets import LATE_NET
from tests.run.test_contract_before_training import NETS as CONTRACT_NETS

PACKAGE = Path(pytest_precalign.__file__).parent
RUN, VERDICT = f"{PACKAGE / 'run'}{os.sep}", f"{PACKAGE / 'verdict'}{os.sep}"

NETS = (  # nets:lagging, a Net whose LambdaLR is one step behind
    LATE_NET
    + CONTRACT_NETS[CONTRACT_NETS.index("def build_lagging") :].replace("build_lagging", "lagging")
    + """
import weakref


def build(**kwargs):
    return Net(**kwargs)
"""
)

TRAIN = "inputs: toks, phases: [forward, backward, step], steps: 3"
CONFIG = f"""
version: 1
models:
  ref: {{source: factory, factory: "nets:build"}}
  late2: {{source: factory, factory: "nets:build", kwargs: {{start: 2}}}}
  lagging: {{source: factory, factory: "nets:lagging"}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}}
cases:
  - {{name: plain, baseline: ref, candidate: ref, inputs: toks, phases: [forward]}}
  - {{name: training, baseline: ref, candidate: ref, {TRAIN}, optimizer: {{name: adamw, lr: 1.0e-2}}}}
  - {{name: contract, baseline: ref, candidate: lagging, {TRAIN},
     optimizer: {{name: adamw, lr: 1.0e-2, schedule: {{warmup_steps: 2}}}}}}
  - {{name: replay, baseline: ref, candidate: late2, {TRAIN}, optimizer: {{name: adamw, lr: 1.0e-2}}}}
"""

JUDGE = "outcome.finish > outcome._judged -> case_verdict.judge_case"
AGAIN = "outcome.judged_again > outcome._judged -> case_verdict.judge_case"
FACTS = "outcome.finish -> case_facts.case_facts"  # from whichever caller of finish
PLANS = "case._run_case > contract_check.contract_before_training -> case_verdict.judge_stopped"


@pytest.fixture
def config(tmp_path: Path) -> Iterator[AlignConfig]:
    (tmp_path / "nets.py").write_text(NETS)
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop("nets", None)
    saved = torch.optim.lr_scheduler.LambdaLR.__init__
    try:
        yield load_config(CONFIG, tmp_path / "align.yaml")
    finally:
        torch.optim.lr_scheduler.LambdaLR.__init__ = saved  # type: ignore[method-assign]
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nets", None)


def _package(frame: FrameType | None) -> str:
    name = frame.f_code.co_filename if frame is not None else ""
    return "run" if name.startswith(RUN) else "verdict" if name.startswith(VERDICT) else ""


def _named(frame: FrameType) -> str:
    return f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}"


def traced(config: AlignConfig, name: str) -> tuple[CaseRun, list[str], int]:
    """The case run, each entry from ``run/`` into ``verdict/`` (``caller's caller > caller ->
    callee``), and the returns from ``verdict/`` into ``run/``."""
    entries: list[str] = []
    returns = [0]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return") or _package(frame) != "verdict":
            return
        back = frame.f_back
        if _package(back) != "run":
            return
        assert back is not None
        if event == "call":
            caller = back.f_back
            entries.append(f"{_named(caller) + ' > ' if caller else ''}{_named(back)} -> {_named(frame)}")
        else:
            returns[0] += 1

    sys.setprofile(profile)
    try:
        run = run_case(config, config.case(name))
    finally:
        sys.setprofile(None)
    return run, [FACTS if e.endswith(f" > {FACTS}") else e for e in entries], returns[0]


def test_a_one_step_case_is_judged_by_one_call(config: AlignConfig) -> None:
    run, entries, returns = traced(config, "plain")
    assert run.verdicts["forward"].passed and run.training is None
    assert (entries, returns) == ([FACTS, JUDGE], 2)


def test_a_training_run_is_judged_once_on_its_plans_and_once_on_its_run(config: AlignConfig) -> None:
    run, entries, returns = traced(config, "training")
    assert run.training is not None and run.training.passed and run.training.steps_compared == 3
    assert (entries, returns) == ([PLANS, FACTS, JUDGE], 3)


def test_a_case_stopped_before_step_0_is_judged_by_one_call(config: AlignConfig) -> None:
    run, entries, returns = traced(config, "contract")
    assert run.stopped and run.training is not None and run.training.first is not None
    assert (run.training.first.step, run.training.first.origin, run.training.steps_compared) == (1, "lr", 0)
    assert not any(v.passed for v in run.verdicts.values())  # every phase carries the run verdict
    assert (entries, returns) == ([PLANS], 1)  # no traces compared: its plans alone


def test_a_replayed_case_is_judged_again_with_what_the_replay_found(config: AlignConfig) -> None:
    run, entries, returns = traced(config, "replay")
    assert run.training is not None and run.training.first is not None
    assert (run.training.first.step, run.training.first.what, run.training.first.origin) == (
        2,
        "forward",
        "late",
    )
    assert replay_text(run.training).endswith(
        "replayed from the baseline's state after step 1: origin late (forward) — "
        "its inputs matched, its output did not (activation of late)"
    )
    # its plans, its run, the replayed step, its run with the replay's finding
    assert (entries, returns) == ([PLANS, FACTS, JUDGE, FACTS, JUDGE, AGAIN], 6)


def test_run_imports_no_verdict_function_but_its_doors() -> None:
    """Types and constants of ``verdict/`` are ``run/``'s to use; its only functions are the doors."""
    called = set()
    for path in sorted((PACKAGE / "run").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("verdict"):
                module = importlib.import_module(f"pytest_precalign.{node.module}")
                for alias in node.names:
                    if inspect.isfunction(getattr(module, alias.name)):
                        called.add(f"{path.stem}: {node.module}.{alias.name}")
    assert called == {
        "outcome: verdict.case_verdict.judge_case",
        "outcome: verdict.case_facts.case_facts",
        "contract_check: verdict.case_verdict.judge_stopped",
    }
