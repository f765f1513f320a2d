"""Acceptance of the trainer family: SGD (momentum), Adam and AdamW through every pair of
trainers that can train the same model -- the tool's loop, a real ``transformers.Trainer``,
PyTorch Lightning's own loop on a tiny HF Qwen2, and megatron-core's own stack on the same
Qwen2 as a megatron-core ``GPTModel`` (weights synced by the preset mapping) -- on a clean
case (warmup then cosine, clipping, weight decay without norms and biases, 2 micro-batches,
3 steps): the contracts agree before step 0 and the runs pass, every phase. The plans alone are
``test_plans_agree.py``'s; the full matrix is slow, one pair per optimizer runs by default."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.run.case import run_case
from pytest_precalign.trace.training_record import read_run_record
from pytest_precalign.verdict.training_contract import check_contract
from tests.helpers.tiny_lm import tiny_qwen2_yaml

HEAD = (
    "version: 1\ndefaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}\nmodels:\n"
    + tiny_qwen2_yaml("hf", positions=32, anchor="q", rms_norm_eps=1.0e-6, tie_word_embeddings=False)
    + """\
  megatron: {source: megatron, preset: qwen2.5, config: *q}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 8, vocab_size: 128, seed: 1, labels: true}
tolerances:
  fp32:
    - {match: "*", kind: loss, atol: 1.0e-5, rtol: 0}
    - {match: "*", atol: 1.0e-4, rtol: 1.0e-3}
cases:
"""
)
COMMON = "clip_grad: 1.0, micro_batches: 2, weight_decay: 0.1, schedule: {warmup_steps: 1, decay: cosine, min_lr: 1.0e-3}"
OPTIMIZERS = {
    "sgd": f"{{name: sgd, lr: 0.05, momentum: 0.9, {COMMON}}}",
    "adam": f"{{name: adam, lr: 0.01, betas: [0.9, 0.95], eps: 1.0e-7, {COMMON}}}",
    "adamw": f"{{name: adamw, lr: 0.01, betas: [0.9, 0.95], eps: 1.0e-7, {COMMON}}}",
}
HF_TRAINERS = ("loop", "hf_trainer", "lightning")
PAIRS = [*combinations(HF_TRAINERS, 2), *((t, "megatron") for t in HF_TRAINERS)]
# By default one pair per optimizer (each trainer in one of them); the rest with -m slow.
DEFAULT = {
    ("sgd", "hf_trainer", "lightning"),
    ("adam", "lightning", "megatron"),
    ("adamw", "loop", "megatron"),
}


def _matrix() -> list[object]:
    out: list[object] = []
    for optimizer in OPTIMIZERS:
        for baseline, candidate in PAIRS:
            marks = () if (optimizer, baseline, candidate) in DEFAULT else (pytest.mark.slow,)
            out.append(pytest.param(optimizer, baseline, candidate, marks=marks))
    return out


def _case(optimizer: str, baseline: str, candidate: str) -> str:
    megatron = candidate == "megatron"
    return f"""  - name: {optimizer}_{baseline}_vs_{candidate}
    baseline: hf
    candidate: {"megatron" if megatron else "hf"}
    inputs: toks
    phases: [forward, backward, step]
    steps: 3
    training: {{baseline: {baseline}, candidate: {candidate}}}
    optimizer: {OPTIMIZERS[optimizer]}
    record: {{mode: {"tensor" if megatron else "stats"}}}
    tolerances: fp32
""" + ('    mapping: "preset:megatron-qwen2.5"\n' if megatron else "")


@pytest.mark.parametrize(("optimizer", "baseline", "candidate"), _matrix())
def test_every_pair_of_trainers_agrees_on_the_contract_and_passes(
    tmp_path: Path, optimizer: str, baseline: str, candidate: str
) -> None:
    for needed in {"lightning": "lightning", "hf_trainer": "accelerate", "megatron": "megatron.core"}.items():
        if needed[0] in (baseline, candidate):
            pytest.importorskip(needed[1])
    config = load_config(HEAD + _case(optimizer, baseline, candidate), tmp_path / "align.yaml")
    run = run_case(config, config.cases[0])
    base, cand = read_run_record(run.baseline.manifest), read_run_record(run.candidate.manifest)
    assert (base.settings.trainer, cand.settings.trainer) == (baseline, candidate)  # type: ignore[union-attr]
    assert base.plan is not None and cand.plan is not None and base.plan.optimizer == optimizer
    assert run.training is not None and run.training.first is None, run.training.first
    assert run.training.steps_compared == 3  # trained, not stopped before step 0
    assert all(v.passed for v in run.verdicts.values()), run.verdicts
    if candidate != "megatron":  # same names: the plans agree as they are
        assert check_contract(base.plan, cand.plan) is None
