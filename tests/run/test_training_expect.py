"""A training case's ``expect: {step, diverged}`` (config -> run_case -> the item's outcome): a
layer bug that starts at step 5 of an 8-step case is found at step 5 as ``forward``, and the
case passes only when its expectation names exactly that step and class."""

from __future__ import annotations

import sys
from pathlib import Path

from pytest_precalign.config.loader import load_config
from pytest_precalign.reports.outcome import phase_outcome
from pytest_precalign.reports.text import PhaseReport
from pytest_precalign.reports.training_text import training_lines
from pytest_precalign.run.case import run_case
from tests.helpers.late_nets import NETS

CONFIG = """
version: 1
models:
  ref: {source: factory, factory: "nets:build"}
  late: {source: factory, factory: "nets:build", kwargs: {start: 5}}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}
cases:
  - {name: clean, baseline: ref, candidate: ref, inputs: toks, phases: [forward, backward, step], steps: 8}
  - {name: found, baseline: ref, candidate: late, inputs: toks, phases: [forward, backward, step], steps: 8,
     expect: {step: 5, diverged: forward}}
  - {name: wrong_step, baseline: ref, candidate: late, inputs: toks, phases: [forward, backward, step],
     steps: 8, expect: {step: 4, diverged: forward}}
  - {name: wrong_class, baseline: ref, candidate: late, inputs: toks, phases: [forward, backward, step],
     steps: 8, expect: {step: 5, diverged: optimizer_update}}
"""


def outcomes(tmp_path: Path) -> dict[str, tuple[bool, str]]:
    (tmp_path / "nets.py").write_text(NETS)
    config = load_config(CONFIG, tmp_path / "align.yaml")
    sys.path.insert(0, str(tmp_path))
    try:
        out = {}
        for case in config.cases:
            run = run_case(config, case)
            for phase in case.phases:
                report = PhaseReport.of_run(
                    run, phase, defined_in="align.yaml", baseline="ref", candidate="late", reproduce="r"
                )
                outcome = phase_outcome(report)
                out[f"{case.name}[{phase}]"] = (outcome.passed, outcome.message)
                if case.name == "found" and phase == "forward":
                    assert run.training is not None and run.training.first is not None
                    first = run.training.first
                    assert (first.step, first.what, first.origin) == (5, "forward", "late")
                    text = "\n".join(training_lines(run.training))
                    assert text.startswith(
                        "Step 5 diverged first: forward, origin late — its inputs matched, its output did "
                        "not (activation of late)\n  steps 6-7 are downstream of it\n"
                        "  judged over 8 step(s) in the approximate lane"
                    ), text
        return out
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nets", None)


def test_a_training_expectation_passes_only_when_found_exactly(tmp_path: Path) -> None:
    found = outcomes(tmp_path)
    assert {k: v[0] for k, v in found.items()} == {
        **{f"clean[{p}]": True for p in ("forward", "backward", "step")},
        **{f"found[{p}]": True for p in ("forward", "backward", "step")},
        "wrong_step[forward]": False,
        "wrong_step[backward]": True,
        "wrong_step[step]": True,
        "wrong_class[forward]": True,
        "wrong_class[backward]": True,
        "wrong_class[step]": False,
    }
    message = found["wrong_step[forward]"][1]
    assert message.startswith(
        "Known divergence not reproduced: expected step 4 forward, found step 5 forward (late)"
    )
