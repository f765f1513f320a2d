"""Activation recomputation in megatron-core on the CPU: the megatron source takes
``recompute_granularity`` / ``recompute_method`` / ``recompute_num_layers``; its
``CheckpointFunction`` asks for the CUDA RNG state, answered on the CPU (megatron_cpu) in the
forward and in the backward that recomputes it. A recomputing model equals the same model
without recomputation, bit for bit, through forward, backward and AdamW steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import PrecalignError
from pytest_precalign.run.case import preflight_case, run_case

CONFIG = """
version: 1
defaults: {{device: cpu, dtype: float32, seed: 0}}
models:
  plain:
    source: megatron
    config: &tiny {{vocab_size: 64, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
                   num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64}}
  recomputed:
    source: megatron
    config: *tiny
{recompute}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 8, vocab_size: 64, seed: 1, labels: true}}
tolerances:
  exact:
    - {{match: "*", atol: 0, rtol: 0, why: "recomputation repeats the same arithmetic"}}
cases:
  - {{name: recompute, baseline: plain, candidate: recomputed, inputs: toks,
     phases: [forward, backward, step], steps: 2, record: {{mode: tensor}}, tolerances: exact}}
"""


@pytest.mark.parametrize(
    "recompute",
    [
        "    recompute_granularity: full\n    recompute_method: uniform\n    recompute_num_layers: 1",
        "    recompute_granularity: full\n    recompute_method: block\n    recompute_num_layers: 2",
        "    recompute_granularity: selective",
    ],
    ids=["full-uniform-1", "full-block-2", "selective"],
)
def test_a_recomputing_megatron_model_equals_the_plain_one(tmp_path: Path, recompute: str) -> None:
    config = load_config(CONFIG.format(recompute=recompute), tmp_path / "align.yaml")
    run = run_case(config, config.case("recompute"))
    assert {p: v.passed for p, v in run.verdicts.items()} == {"forward": True, "backward": True, "step": True}
    assert all(v.compared > 0 for v in run.verdicts.values())


@pytest.mark.parametrize(
    ("recompute", "message"),
    [
        ("    recompute_granularity: everything", "recompute_granularity: unknown value 'everything'"),
        (
            "    recompute_granularity: full\n    recompute_method: half",
            "recompute_method: unknown value 'half'",
        ),
        (
            "    recompute_granularity: full\n    recompute_num_layers: 0",
            "recompute_num_layers: expected an integer >= 1",
        ),
        ("    recompute_method: uniform", "recompute_method: needs recompute_granularity"),
    ],
    ids=["granularity", "method", "num-layers", "method-alone"],
)
def test_a_bad_recompute_setting_is_one_message(tmp_path: Path, recompute: str, message: str) -> None:
    config = load_config(CONFIG.format(recompute=recompute), tmp_path / "align.yaml")
    with pytest.raises(PrecalignError) as excinfo:
        preflight_case(config, config.case("recompute"))
    assert f"models.recomputed.{message}" in str(excinfo.value)
