"""The training keys of a case: ``optimizer:`` schedule, clipping, no_decay, micro_batches;
``training:`` per side; ``kind: dataset`` inputs; and the bad input each must name."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError
from pytest_precalign.steps.spec import OptimizerSpec, ScheduleSpec, SidesTraining

BASE = """\
version: 1
models:
  base: {source: hf, class: "transformers:Qwen2ForCausalLM", config: {vocab_size: 16}}
  cand: {source: factory, factory: "tiny_models:build"}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 3, vocab_size: 4, labels: true}
cases:
  - name: c1
    baseline: base
    candidate: cand
    inputs: toks
    phases: [forward, backward, step]
    steps: 3
"""


def _load(tmp_path: Path, extra: str, text: str = BASE):  # type: ignore[no-untyped-def]
    return load_config(text + extra, tmp_path / "align.yaml")


def _error(tmp_path: Path, extra: str, text: str = BASE) -> str:
    with pytest.raises(ConfigError) as excinfo:
        _load(tmp_path, extra, text)
    return str(excinfo.value)


def test_full_optimizer_spec_is_parsed(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        "    optimizer:\n"
        "      lr: 0.01\n      weight_decay: 0.1\n      clip_grad: 1.0\n      micro_batches: 2\n"
        "      no_decay: ['*.bias', '*norm*']\n"
        "      schedule: {warmup_steps: 1, decay: cosine, min_lr: 0.001}\n"
        "    training: {baseline: loop, candidate: loop}\n",
    )
    case = config.cases[0]
    assert case.training.optimizer == OptimizerSpec(
        lr=0.01,
        weight_decay=0.1,
        clip_grad=1.0,
        micro_batches=2,
        no_decay=("*.bias", "*norm*"),
        schedule=ScheduleSpec(warmup_steps=1, decay="cosine", decay_steps=None, min_lr=0.001),
    )
    assert case.training.trainers == SidesTraining("loop", "loop")


def test_one_trainer_for_both_sides_and_defaults(tmp_path: Path) -> None:
    text = BASE.replace(
        'cand: {source: factory, factory: "tiny_models:build"}',
        'cand: {source: hf, class: "transformers:Qwen2ForCausalLM", config: {vocab_size: 16}}',
    )
    case = _load(tmp_path, "    training: hf_trainer\n", text).cases[0]
    assert case.training.trainers == SidesTraining("hf_trainer", "hf_trainer")
    assert _load(tmp_path, "").cases[0].training.trainers == SidesTraining()
    assert _load(tmp_path, "").cases[0].training.optimizer == OptimizerSpec()


def test_own_megatron_model_trains_as_a_presets_model(tmp_path: Path) -> None:
    """``source: factory`` with ``runtime: megatron`` (a megatron-core model of the user's own):
    megatron-core's trainer by default, as a preset's model, or the tool's loop; not a trainer
    of HF or Lightning models."""
    text = BASE.replace(
        'cand: {source: factory, factory: "tiny_models:build"}',
        'cand: {source: factory, factory: "tiny_models:build", runtime: megatron}',
    )
    assert _load(tmp_path, "", text).cases[0].training.trainers == SidesTraining(None, "megatron")
    assert _load(tmp_path, "    training: {candidate: loop}\n", text).cases[
        0
    ].training.trainers == SidesTraining(None, "loop")
    message = _error(tmp_path, "    training: {candidate: lightning}\n", text)
    assert (
        "trainer 'lightning' cannot train model 'cand' (runtime: megatron; allowed: loop, megatron)"
        in message
    )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("    optimizer: {micro_batches: 3}\n", "micro_batches 3 does not divide inputs.toks's batch 4"),
        ("    optimizer: {micro_batches: 0}\n", "cases[0].optimizer.micro_batches: must be >= 1"),
        ("    optimizer: {clip_grad: 0}\n", "cases[0].optimizer.clip_grad: must be > 0"),
        (
            "    optimizer: {schedule: {decay: step}}\n",
            "unknown value 'step' (allowed: constant, linear, cosine)",
        ),
        (
            "    optimizer: {schedule: {warmup_steps: 3, decay_steps: 2}}\n",
            "decay_steps: must be >= warmup_steps (3)",
        ),
        (
            "    optimizer: {lr: 0.1, schedule: {min_lr: 0.2}}\n",
            "min_lr: must be <= the optimizer's lr (0.1)",
        ),
        ("    optimizer: {no_decay: [1]}\n", "optimizer.no_decay: expected a glob or a list of globs"),
        ("    training: keras\n", "unknown trainer 'keras' (allowed: loop, hf_trainer, megatron, lightning)"),
        (
            "    training: {candidate: hf_trainer}\n",
            "trainer 'hf_trainer' cannot train model 'cand' (source 'factory'",
        ),
        ("    training: {baseline: megatron}\n", "trainer 'megatron' cannot train model 'base' (source 'hf'"),
        (
            "    training: {baseline: hf_trainer}\n    optimizer: {schedule: {decay: linear, min_lr: 0.0001}}\n",
            "transformers.Trainer cannot express this schedule: decay 'linear' to a min_lr > 0",
        ),
        (
            "    training: {baseline: hf_trainer}\n    optimizer: {no_decay: ['*.bias']}\n",
            "transformers.Trainer cannot express no_decay globs",
        ),
        (
            "    training: {baseline: hf_trainer}\n    optimizer: {schedule: {decay: cosine, decay_steps: 5}}\n",
            "transformers.Trainer cannot express this schedule: decay_steps 5 differs from steps 3",
        ),
    ],
)
def test_bad_training_settings_are_one_message(tmp_path: Path, extra: str, expected: str) -> None:
    message = _error(tmp_path, extra)
    assert expected in message
    assert str(tmp_path / "align.yaml") in message and "\n" not in message


DATASET = """\
version: 1
models:
  base: {source: factory, factory: "tiny_models:build"}
  cand: {source: factory, factory: "tiny_models:build"}
inputs:
  rows: {kind: dataset, path: rows.jsonl, batch: 2}
cases:
  - name: c1
    baseline: base
    candidate: cand
    inputs: rows
    phases: [forward, backward, step]
"""


def test_dataset_rows_are_read_and_steps_beyond_them_rejected(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text("[1, 2, 3]\n[4, 5, 6]\n[7, 8, 9]\n[1, 1, 1]\n[2, 2, 2]\n")
    config = _load(tmp_path, "    steps: 2\n", DATASET)
    spec = config.inputs["rows"]
    assert spec.kind == "dataset" and spec.batch == 2 and spec.seq_len == 3 and spec.labels
    assert spec.input_ids is None and spec.path == tmp_path / "rows.jsonl"  # rows read per case
    message = _error(tmp_path, "    steps: 3\n", DATASET)
    assert "cases[0].steps: steps 3 is beyond inputs.rows's data: 5 rows make 2 batch(es) of 2" in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[1, 2]\n[1]\n", "rows.jsonl:2: row 2: a row of 1 ids, the first row has 2"),
        ("[1, -2]\n", "rows.jsonl:1: row 1: expected a row of token ids >= 0"),
        ("", "has no rows of token ids"),
    ],
)
def test_bad_dataset_file_is_named(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / "rows.jsonl").write_text(content)
    assert expected in _error(tmp_path, "", DATASET)


def test_missing_dataset_file_is_named(tmp_path: Path) -> None:
    assert f"inputs.rows.path: {tmp_path / 'rows.jsonl'}: file not found" in _error(tmp_path, "", DATASET)
