"""Megatron presets beyond Qwen2.5 (llama, qwen3) and the strict weight sync: HF Qwen3 against
the qwen2.5 preset, Llama-3.1 rope scaling built as HF builds it, and one-line config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import CaseError, PrecalignError
from pytest_precalign.reports.document import phase_dict
from pytest_precalign.reports.text import PhaseReport, failure_message, summary_line
from pytest_precalign.run.case import preflight_case, run_case

pytest.importorskip("megatron.core")

# HF Qwen3 (with attention_bias, so that every Megatron qwen2.5 parameter has a source: on main
# the case ran, its q/k norms and o_proj bias dropped from the sync) against a Megatron model
# built by %(preset)s and synced through %(mapping)s.
SHARED = (
    "vocab_size: 1000, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
    "num_key_value_heads: 2, rope_theta: 1000000.0, max_position_embeddings: 128, tie_word_embeddings: false"
)
QWEN3_CONFIG = """
version: 1
models:
  hf:
    source: hf
    class: transformers.Qwen3ForCausalLM
    attn_implementation: eager
    config: {%(shared)s, head_dim: 16, attention_bias: %(bias)s}
  mc: {source: megatron, preset: %(preset)s, config: {%(shared)s%(mc_extra)s}}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 16, vocab_size: 1000, seed: 5, labels: true}
tolerances:
  t:
    - {match: "*", atol: 1.0e-6, rtol: 1.0e-6, why: fp32}
cases:
  - {name: c, baseline: hf, candidate: mc, inputs: toks, mapping: "%(mapping)s",
     phases: [forward], record: {mode: tensor}, tolerances: t%(weights)s}
"""

NORMS = [
    f"model.layers.{i}.self_attn.{n}"
    for i in (0, 1)
    for n in ("o_proj.bias", "q_norm.weight", "k_norm.weight")
]


def _qwen3_case(tmp_path: Path, **kw: str):
    values = {
        "preset": "qwen2.5",
        "mapping": "preset:megatron-qwen2.5",
        "bias": "true",
        "weights": "",
        "mc_extra": "",
    }
    values |= kw | {"shared": SHARED}
    config = load_config(QWEN3_CONFIG % values, tmp_path / "align.yaml")
    return config, config.cases[0]


def test_qwen3_against_the_qwen25_preset_fails_by_default_naming_the_q_and_k_norms(tmp_path):
    """On main this case ran: the four norms were dropped from the sync without a word."""
    config, case = _qwen3_case(tmp_path)
    with pytest.raises(CaseError) as info:
        run_case(config, case)
    message = str(info.value)
    assert "case 'c'" in message and "mapping 'preset:megatron-qwen2.5'" in message, message
    assert f"6 baseline parameter(s) were not consumed: {', '.join(NORMS[:5])} ... (6 in all) (" in message
    assert "weights: {strict: false}" in message and "\n" not in message


def test_strict_false_runs_and_reports_the_skipped_baseline_parameters(tmp_path):
    config, case = _qwen3_case(tmp_path, weights=", weights: {strict: false}")
    run = run_case(config, case)
    assert run.sync is not None and list(run.sync.unused) == NORMS and run.sync.unsynced == ()
    verdict = run.verdicts["forward"]
    assert not verdict.passed and verdict.first is not None
    assert verdict.first.name.startswith("model.layers.0.self_attn"), verdict.first.name
    report = PhaseReport.of_run(
        run, "forward", defined_in=str(config.path), baseline="hf", candidate="mc", reproduce="r"
    )
    assert phase_dict(report)["weights"]["unused"] == NORMS
    message = failure_message(report)
    expected = f"  baseline parameters not used: {', '.join(NORMS[:5])} ... (6 in all)"
    assert expected in message.splitlines(), message
    assert "; weights: 6 baseline parameters not used;" in summary_line(report), summary_line(report)


def test_qwen3_preset_syncs_every_parameter_and_aligns(tmp_path):
    config, case = _qwen3_case(
        tmp_path, preset="qwen3", mapping="preset:megatron-qwen3", bias="false", mc_extra=", head_dim: 16"
    )
    run = run_case(config, case)
    assert run.sync is not None and (run.sync.unused, run.sync.unsynced) == ((), ())
    assert run.verdicts["forward"].passed, failure_message(
        PhaseReport.of_run(run, "forward", defined_in="a", baseline="hf", candidate="mc", reproduce="r")
    )


LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 2.0,  # not megatron-core's fixed 1: the config's value must be used
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


@pytest.mark.parametrize("form", ["rope_scaling", "rope_parameters"])  # legacy, transformers 5
def test_llama3_rope_scaling_gives_megatron_the_inverse_frequencies_hf_uses(tmp_path, form):
    from transformers import LlamaConfig, LlamaForCausalLM

    from pytest_precalign.sources.megatron import build, runtime

    fields = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500000.0,
              "max_position_embeddings": 64}  # fmt: skip
    hf = LlamaForCausalLM(LlamaConfig(**fields, rope_scaling=LLAMA3_SCALING))
    plain = LlamaForCausalLM(LlamaConfig(**fields))
    given = {**fields, "rope_scaling": LLAMA3_SCALING}
    if form == "rope_parameters":
        given = {k: v for k, v in fields.items() if k != "rope_theta"}
        given["rope_parameters"] = {**LLAMA3_SCALING, "rope_theta": fields["rope_theta"]}
    text = (
        "version: 1\nmodels:\n  a: {source: factory, factory: 'torch.nn:Identity'}\n"
        f"  mc: {{source: megatron, preset: llama, config: {given}}}\n"
        "inputs:\n  x: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 10}\n"
        "cases:\n  - {name: c, baseline: a, candidate: mc, inputs: x, weights: {sync: false}}\n"
    )
    spec = load_config(text, tmp_path / "a.yaml").models["mc"]
    with runtime(spec):
        inv_freq = build(spec, tmp_path).rotary_pos_emb.inv_freq
    assert torch.equal(inv_freq, hf.model.rotary_emb.inv_freq)
    assert not torch.equal(inv_freq, plain.model.rotary_emb.inv_freq)  # the scaling bends some


@pytest.mark.parametrize(
    ("preset", "extra", "fragment"),
    [
        ("llama", "rope_type_x: 1", "config: unknown field 'rope_type_x' for preset 'llama' (allowed: vocab_size,"),
        ("llama", "attention_bias: true", "config.attention_bias: preset 'llama' builds without it (allowed: false)"),
        ("qwen3", "use_sliding_window: true", "use_sliding_window: preset 'qwen3' builds without it"),
        ("qwen2.5", "head_dim: 8", "unknown field 'head_dim' for preset 'qwen2.5'"),
        ("llama", "rope_scaling: {rope_type: yarn, factor: 4.0}",
         "config.rope_scaling.rope_type: 'yarn' is not built by source megatron (allowed: default, llama3)"),
        ("llama", "rope_scaling: {rope_type: llama3, factor: 4.0}",
         "config.rope_scaling: rope_type llama3 needs low_freq_factor"),
        ("llama", "rope_parameters: {rope_type: linear, factor: 4.0}",
         "config.rope_parameters.rope_type: 'linear' is not built by source megatron"),
    ],
)  # fmt: skip
def test_preset_config_errors_are_one_line_naming_the_key(tmp_path, preset, extra, fragment):
    text = (
        "version: 1\nmodels:\n  a: {source: factory, factory: 'torch.nn:Identity'}\n"
        f"  mc: {{source: megatron, preset: {preset}, config: {{num_attention_heads: 4, {extra}}}}}\n"
        "inputs:\n  x: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 10}\n"
        "cases:\n  - {name: c, baseline: a, candidate: mc, inputs: x, weights: {sync: false}}\n"
    )
    config = load_config(text, tmp_path / "a.yaml")
    with pytest.raises(PrecalignError) as info:
        preflight_case(config, config.cases[0])
    assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert "models.mc" in str(info.value)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("attn_logit_softcapping: 50.0", "unknown field 'attn_logit_softcapping' for preset 'llama'"),
        ("attention_bias: true", "config.attention_bias: preset 'llama' builds without it"),
        ("rope_scaling: {rope_type: yarn, factor: 4.0}", "'yarn' is not built by source megatron"),
    ],
)
def test_a_family_no_preset_builds_is_pointed_to_your_own_megatron_model(tmp_path, extra, fragment):
    """Gemma2's soft-capping against the Llama preset: the refusal says where such a model goes."""
    text = (
        "version: 1\nmodels:\n  a: {source: factory, factory: 'torch.nn:Identity'}\n"
        f"  mc: {{source: megatron, preset: llama, config: {{num_attention_heads: 4, {extra}}}}}\n"
        "inputs:\n  x: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 10}\n"
        "cases:\n  - {name: c, baseline: a, candidate: mc, inputs: x, weights: {sync: false}}\n"
    )
    config = load_config(text, tmp_path / "a.yaml")
    with pytest.raises(PrecalignError) as info:
        preflight_case(config, config.cases[0])
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
    assert message.endswith(
        "; a family no preset builds is your own megatron-core model through source: factory with "
        "runtime: megatron (docs/megatron_vs_hf.md, 'Your own Megatron model')"
    ), message


@pytest.mark.parametrize(("window", "refused"), [("", True), (", sliding_window: null", False)])
def test_an_hf_sliding_window_against_a_preset_without_one_is_refused_before_comparing(
    tmp_path, window, refused
):
    """An HF Mistral (sliding_window 4096 by default) against ``preset: llama`` (full attention)."""
    fields = "{vocab_size: 100, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2"
    text = (
        "version: 1\nmodels:\n"
        f"  hf: {{source: hf, class: transformers.MistralForCausalLM, config: {fields}{window}}}}}\n"
        f"  mc: {{source: megatron, preset: llama, config: {fields}}}}}\n"
        "inputs:\n  x: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 100}\n"
        "cases:\n  - {name: c, baseline: hf, candidate: mc, inputs: x}\n"
    )
    config = load_config(text, tmp_path / "a.yaml")
    if not refused:
        preflight_case(config, config.cases[0])
        return
    with pytest.raises(PrecalignError) as info:
        preflight_case(config, config.cases[0])
    message = str(info.value)
    assert "models.hf.config: sliding_window 4096" in message and "preset 'llama'" in message, message
    assert "set sliding_window: null" in message and "\n" not in message
