"""A converted checkpoint checked by a case, end to end (serially and with -n 2): the baseline
HF model loads the real HF folder, the Megatron candidate loads what megatron-core wrote from
the suite's conversion (legacy TP=2 or torch_dist), no weight sync. The right conversion is
aligned in forward and backward; each planted conversion bug is the origin at its module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.checkpoints import HF_CONFIG_HEAD
from tests.helpers.runs import RunPytest

pytest.importorskip("megatron.core")

CONFIG = (
    HF_CONFIG_HEAD
    + """\
  mc_tp2: {{source: megatron, config: *c, weights: {{load: {ck}/good/tp2, format: megatron}}}}
  mc_dist: {{source: megatron, config: *c, weights: {{load: {ck}/good/dist, format: megatron-dist}}}}
  mc_fc1: {{source: megatron, config: *c, weights: {{load: {ck}/bad_fc1/tp2, format: megatron}}}}
  mc_qkv: {{source: megatron, config: *c, weights: {{load: {ck}/bad_qkv/dist, format: megatron-dist}}}}
inputs:
  tokens: {{kind: tokens, batch: 2, seq_len: 16, vocab_size: 64, seed: 1, labels: true}}
tolerances:
  fp32:
    - {{match: "*", kind: loss, atol: 1.0e-6, rtol: 0, why: "measured 0"}}
    - {{match: "*", phase: forward, atol: 1.0e-6, rtol: 0, why: "same weights, same arithmetic"}}
    - {{match: "*", phase: backward, atol: 1.0e-6, rtol: 1.0e-5, why: "fused qkv/fc1 sum grads in another order"}}
cases:
  - {{name: converted_tp2, baseline: hf, candidate: mc_tp2, inputs: tokens, mapping: "preset:megatron-qwen2.5",
     phases: [forward, backward], record: {{mode: tensor}}, tolerances: fp32, weights: {{sync: false}}}}
  - {{name: converted_dist, baseline: hf, candidate: mc_dist, inputs: tokens, mapping: "preset:megatron-qwen2.5",
     phases: [forward], record: {{mode: tensor}}, tolerances: fp32, weights: {{sync: false}}}}
  - {{name: gate_up_swapped, baseline: hf, candidate: mc_fc1, inputs: tokens, mapping: "preset:megatron-qwen2.5",
     phases: [forward], record: {{mode: tensor}}, tolerances: fp32, weights: {{sync: false}}}}
  - {{name: qkv_not_interleaved, baseline: hf, candidate: mc_qkv, inputs: tokens,
     mapping: "preset:megatron-qwen2.5", phases: [forward], record: {{mode: tensor}}, tolerances: fp32,
     weights: {{sync: false}}}}
"""
)


def test_case_checks_a_converted_checkpoint_and_names_the_planted_bugs(
    pytester: pytest.Pytester, run_pytest: RunPytest, hf_dir: Path, megatron_ckpts: Path
) -> None:
    (pytester.path / "align.yaml").write_text(CONFIG.format(hf=hf_dir, ck=megatron_ckpts), encoding="utf-8")
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out", "-rN")
    text = result.stdout.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    result.assert_outcomes(passed=3, failed=2)
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    first = {(c["name"], c["phase"]): c["first_divergence"] for c in report["cases"]}
    assert first[("converted_tp2", "forward")] is None and first[("converted_tp2", "backward")] is None
    assert first[("converted_dist", "forward")] is None
    named = {
        case: (first[(case, "forward")]["name"], first[(case, "forward")]["origin"])
        for case in ("gate_up_swapped", "qkv_not_interleaved")
    }
    assert named == {
        "gate_up_swapped": ("model.layers.1.mlp.gate_proj", True),
        "qkv_not_interleaved": ("model.layers.0.self_attn.q_proj", True),
    }
