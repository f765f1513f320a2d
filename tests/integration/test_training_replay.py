"""The replay through the plugin: a failing training case's item tells the whole story in its
message (the first divergent step, the scalars there, the step replayed from the baseline's
state and the origin it names) and report.json's ``training.replay`` holds it."""

from __future__ import annotations

import json

import pytest

from tests.helpers.late_nets import NETS
from tests.helpers.runs import RunPytest

CONFIG = """
version: 1
models:
  ref: {source: factory, factory: "nets:build"}
  late: {source: factory, factory: "nets:build", kwargs: {start: 4}}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}
cases:
  - {name: layer_bug, baseline: ref, candidate: late, inputs: toks, phases: [forward, backward, step],
     steps: 6, optimizer: {name: adamw, lr: 1.0e-2, clip_grad: 1.0, schedule: {warmup_steps: 2}}}
"""


def test_the_failing_item_tells_the_replays_story(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(nets=NETS)
    (pytester.path / "align.yaml").write_text(CONFIG)
    result = run_pytest("--align-config", "align.yaml", str(pytester.path), "--align-report", "out")
    result.assert_outcomes(failed=3)  # every phase: its records downstream of step 4
    result.stdout.re_match_lines(
        [
            r".*Step 4 diverged first \(loss \S+ vs \S+\); replayed from the baseline's state after "
            r"step 3: origin late \(forward\) — its inputs matched, its output did not \(activation of late\)"
        ]
    )
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    replays = [c["training"]["replay"] for c in report["cases"] if c.get("training")]
    assert replays and all(r["origin"] == "late" and r["from_step"] == 3 for r in replays)
    html = (pytester.path / "out" / "report.html").read_text()
    assert '<p class="replay">Step 4 diverged first (loss ' in html
