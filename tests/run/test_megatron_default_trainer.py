"""Megatron's own stack is the default trainer of a Megatron model: a side without
``training:`` whose model is ``source: megatron`` trains with megatron-core's DDP, optimizer and
scheduler (in process and launched); ``training: loop`` still picks the loop. And
``data_parallel`` is a launched model's option like the other parallel sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.config.launch import launched, world_size
from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError
from pytest_precalign.run.side import run_side
from pytest_precalign.sources import build_model, runtime
from pytest_precalign.sources.inputs import build_inputs

pytest.importorskip("megatron.core")

CONFIG = """
version: 1
models:
  hf: {source: hf, class: transformers.Qwen2ForCausalLM, config: &c {vocab_size: 128, hidden_size: 32,
       intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
       max_position_embeddings: 64, tie_word_embeddings: false}}
  mc: {source: megatron, preset: qwen2.5, config: *c}
  mc_dp2: {source: megatron, preset: qwen2.5, config: *c, data_parallel: 2, launch: {nproc: 2}}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 16, vocab_size: 128, seed: 3, labels: true}
cases:
  - {name: default, baseline: hf, candidate: mc, mapping: "preset:megatron-qwen2.5", inputs: toks,
     phases: [forward, backward, step], steps: 2, optimizer: {lr: 1.0e-3, clip_grad: 1.0}}
  - {name: loop, baseline: hf, candidate: mc, mapping: "preset:megatron-qwen2.5", inputs: toks,
     phases: [forward, backward, step], steps: 2, training: loop}
"""


def _load(tmp_path: Path, text: str = CONFIG) -> object:
    path = tmp_path / "align.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(text, path)


def test_a_megatron_side_without_training_defaults_to_megatrons_stack(tmp_path: Path) -> None:
    config = _load(tmp_path)
    default, loop = config.cases  # type: ignore[attr-defined]
    assert (default.training.trainers.baseline, default.training.trainers.candidate) == (None, "megatron")
    assert (loop.training.trainers.baseline, loop.training.trainers.candidate) == ("loop", "loop")


def test_the_default_trainer_steps_with_megatron_cores_optimizer(tmp_path: Path) -> None:
    config = _load(tmp_path)
    case = config.cases[0]  # type: ignore[attr-defined]
    spec = config.models["mc"]  # type: ignore[attr-defined]
    data = build_inputs(config.inputs["toks"], tmp_path, case.steps)  # type: ignore[attr-defined]
    with runtime(spec):
        model = build_model(spec, tmp_path)
        trace = run_side(model, data, case, {"side": "candidate"}, seed=0)
    training = trace.manifest["training"]
    assert training["trainer"] == "megatron"
    assert training["arguments"]["optimizer_class"] == ["ChainedOptimizer", "FP32Optimizer"]
    assert training["arguments"]["OptimizerConfig"]["clip_grad"] == 1.0
    assert {r.kind for r in trace.records} >= {"param_grad", "param"}


def test_data_parallel_is_read_with_the_other_parallel_sizes(tmp_path: Path) -> None:
    spec = _load(tmp_path).models["mc_dp2"]  # type: ignore[attr-defined]
    assert spec.options["data_parallel"] == 2 and launched(spec.options) and world_size(spec.options) == 2


@pytest.mark.parametrize(
    ("new", "fragment"),
    [
        ("data_parallel: 2, launch: {nproc: 4}", "nproc must be 2"),
        ("data_parallel: 0, launch: {nproc: 2}", "must be >= 1"),
    ],
)
def test_bad_data_parallel_is_one_config_error(tmp_path: Path, new: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        _load(tmp_path, CONFIG.replace("data_parallel: 2, launch: {nproc: 2}", new))
