"""The launched ranks reduce grads as Megatron's training loop does (``run/grad_sync.py``:
megatron-core's ``finalize_model_grads`` as the schedule's ``finalize_model_grads_func``) and
record parameter grads after that reduction.

Qwen3 at TP=2: each rank normalises its own heads with the whole ``q_layernorm``/``k_layernorm``
weight, so before the tensor-parallel all-reduce its grad is a partial sum (a few 1e-3 off).
After it, both ranks hold the TP=1 grad. One real 2-rank torchrun run (gloo, CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from pytest_precalign.config.loader import load_config  # noqa: E402
from pytest_precalign.recording.determinism import deterministic  # noqa: E402
from pytest_precalign.run.launch import launch_ranks, merge_launched  # noqa: E402
from pytest_precalign.run.side import run_side  # noqa: E402
from pytest_precalign.sources import build_model, runtime  # noqa: E402
from pytest_precalign.sources.inputs import build_inputs  # noqa: E402
from pytest_precalign.trace.native_io import read_trace  # noqa: E402

CONFIG = """
version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  tp1: {source: megatron, preset: qwen3, config: &q3 {vocab_size: 128, hidden_size: 32,
        intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2,
        head_dim: 16, rms_norm_eps: 1.0e-6, rope_theta: 1000000.0, max_position_embeddings: 64,
        tie_word_embeddings: false}}
  tp2: {source: megatron, preset: qwen3, tensor_parallel: 2, config: *q3}
inputs:
  tokens: {kind: tokens, batch: 2, seq_len: 8, vocab_size: 128, seed: 1, labels: true}
cases:
  - {name: grads, baseline: tp1, candidate: tp2, inputs: tokens, phases: [forward, backward],
     record: {mode: tensor}}
"""
NORMS = [f"decoder.layers.0.self_attention.{n}_layernorm.weight" for n in ("q", "k")]


def test_tp2_qk_layernorm_grads_are_reduced_before_they_are_recorded(tmp_path: Path) -> None:
    config = load_config(CONFIG, tmp_path / "align.yaml")
    case = config.case("grads")
    inputs = build_inputs(config.inputs["tokens"], config.base_dir)
    with deterministic(True), runtime(config.models["tp1"]):
        tp1 = build_model(config.models["tp1"], config.base_dir)
        full = {n: p.detach().clone() for n, p in tp1.module.named_parameters()}
        reference = run_side(tp1, inputs, case, {"side": "tp1"}, 0)
        work = tmp_path / "ranks"
        work.mkdir()
        out = launch_ranks(config.models["tp2"], config.base_dir, case, inputs, full, 0, work)
    ranks = [read_trace(out / "step0" / f"rank{r}") for r in range(2)]
    expected = {r.name: reference.tensor(r) for r in reference.records if r.kind == "param_grad"}
    for name in NORMS:
        per_rank = [
            torch.as_tensor(t.tensor(next(r for r in t.records if r.kind == "param_grad" and r.name == name)))
            for t in ranks
        ]
        assert torch.equal(per_rank[0], per_rank[1]), name  # all-reduced: the same on both ranks
        torch.testing.assert_close(per_rank[0], torch.as_tensor(expected[name]), atol=1e-6, rtol=1e-5)
    merged = merge_launched(out, {"side": "candidate"})
    assert "replica_mismatches" not in merged.manifest  # no replica the ranks disagree on
