"""Megatron MoE presets (mixtral, qwen3-moe): HF's fused experts -> one Megatron MLP per expert
-> HF, bitwise, through the mapping presets; the router options each HF family needs; one-line
config errors for what the presets do not build."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import PrecalignError
from pytest_precalign.run.case import preflight_case

pytest.importorskip("megatron.core")

SHARED = (
    "vocab_size: 1000, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
    "num_experts_per_tok: 2, rope_theta: 1000000.0, max_position_embeddings: 128, tie_word_embeddings: false"
)
FAMILIES = {
    "mixtral": ("MixtralForCausalLM", "intermediate_size: 48, num_local_experts: 4"),
    "qwen3-moe": (
        "Qwen3MoeForCausalLM",
        "intermediate_size: 128, moe_intermediate_size: 48, num_experts: 4, head_dim: 32, norm_topk_prob: true",
    ),
}
CONFIG = """
version: 1
models:
  hf: {source: hf, class: transformers.%(cls)s, attn_implementation: eager, config: &c {%(shared)s, %(own)s}}
  mc: {source: megatron, preset: %(preset)s, config: *c}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 16, vocab_size: 1000, seed: 5, labels: true}
cases:
  - {name: c, baseline: hf, candidate: mc, inputs: toks, mapping: "preset:megatron-%(preset)s",
     phases: [forward], record: {mode: tensor}}
"""


def _config(tmp_path: Path, preset: str):
    cls, own = FAMILIES[preset]
    text = CONFIG % {"cls": cls, "shared": SHARED, "own": own, "preset": preset}
    return load_config(text, tmp_path / "align.yaml")


@pytest.mark.parametrize("preset", sorted(FAMILIES))
def test_moe_weights_round_trip_hf_megatron_hf_bitwise(tmp_path, preset):
    from pytest_precalign.mapping.spec import reverse
    from pytest_precalign.mapping.weights import sync_weights
    from pytest_precalign.sources import build_model, runtime

    config = _config(tmp_path, preset)
    mapping = config.cases[0].mapping
    assert mapping is not None
    hf_spec, mc_spec = config.models["hf"], config.models["mc"]
    with runtime(mc_spec):
        hf = build_model(hf_spec, tmp_path).module
        with torch.no_grad():  # norms start at 1 and the router at 0 (Qwen3-MoE): randomise them all
            for p in hf.parameters():
                p.copy_(torch.randn_like(p))
        mc = build_model(mc_spec, tmp_path).module
        forward = sync_weights(hf, mc, mapping, strict=True)
        assert forward.unsynced == () and forward.unused == ()
        # per layer: qkv, router, fc1 and fc2 of each of the 4 experts
        assert forward.transformed == 2 * (1 + 1 + 2 * 4)
        for layer in range(2):
            moe, experts = mc.decoder.layers[layer].mlp, hf.model.layers[layer].mlp.experts
            assert torch.equal(moe.router.weight, hf.model.layers[layer].mlp.gate.weight)
            for e in range(4):  # gate_up_proj[e] is [gate; up] as linear_fc1 holds it
                assert torch.equal(moe.experts.local_experts[e].linear_fc1.weight, experts.gate_up_proj[e])
                assert torch.equal(moe.experts.local_experts[e].linear_fc2.weight, experts.down_proj[e])
        back = build_model(hf_spec, tmp_path).module
        report = sync_weights(mc, back, reverse(mapping), strict=True)
        assert report.unsynced == () and report.unused == ()
    for name, param in hf.named_parameters():
        assert torch.equal(param, dict(back.named_parameters())[name]), name


@pytest.mark.parametrize(
    ("preset", "extra", "pre_softmax"),
    [("mixtral", "", False), ("qwen3-moe", ", norm_topk_prob: true", False), ("qwen3-moe", "", True)],
)
def test_router_takes_the_families_top_k(tmp_path, preset, extra, pre_softmax):
    """HF renormalises the top-k of the softmax (Mixtral; Qwen3-MoE with norm_topk_prob):
    Megatron's softmax over the top-k logits; without renormalising, its pre-softmax router."""
    from pytest_precalign.sources.megatron import build, runtime

    given = "{num_attention_heads: 4, num_key_value_heads: 2, num_experts_per_tok: 2, hidden_size: 32, vocab_size: 50, num_hidden_layers: 1"
    given += ", intermediate_size: 16, " + (
        "num_local_experts: 3" if preset == "mixtral" else "num_experts: 3"
    )
    text = (
        "version: 1\nmodels:\n  a: {source: factory, factory: 'torch.nn:Identity'}\n"
        f"  mc: {{source: megatron, preset: {preset}, config: {given}{extra}}}}}\n"
        "inputs:\n  x: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 10}\n"
        "cases:\n  - {name: c, baseline: a, candidate: mc, inputs: x, weights: {sync: false}}\n"
    )
    spec = load_config(text, tmp_path / "a.yaml").models["mc"]
    with runtime(spec):
        config = build(spec, tmp_path).config
    assert (config.num_moe_experts, config.moe_router_topk) == (3, 2)
    assert config.moe_router_pre_softmax is pre_softmax
    assert (config.moe_aux_loss_coeff, config.moe_router_load_balancing_type) == (0.0, "none")


@pytest.mark.parametrize(
    ("preset", "extra", "fragment"),
    [
        ("mixtral", "output_router_logits: true", "config.output_router_logits: preset 'mixtral' builds without it (allowed: false)"),
        ("mixtral", "router_jitter_noise: 0.1", "config.router_jitter_noise: preset 'mixtral' builds without it (allowed: 0.0)"),
        ("mixtral", "sliding_window: 4096", "config.sliding_window: preset 'mixtral' builds without it (allowed: none)"),
        ("qwen3-moe", "mlp_only_layers: [1]", "config.mlp_only_layers: preset 'qwen3-moe' builds without it (allowed: [])"),
        ("qwen3-moe", "decoder_sparse_step: 2", "config.decoder_sparse_step: preset 'qwen3-moe' builds without it (allowed: 1)"),
        ("qwen3-moe", "num_experts: 4, num_experts_per_tok: 5",
         "config.num_experts_per_tok: 5 must be between 1 and the number of experts (4)"),
        ("qwen3-moe", "num_experts: 4, shared_expert_intermediate_size: 8",
         "unknown field 'shared_expert_intermediate_size' for preset 'qwen3-moe'"),
    ],
)  # fmt: skip
def test_moe_preset_config_errors_are_one_line_naming_the_key(tmp_path, preset, extra, fragment):
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


def test_moe_preset_at_tensor_parallel_2_is_an_error(tmp_path):
    text = (
        "version: 1\nmodels:\n  a: {source: factory, factory: 'torch.nn:Identity'}\n"
        "  mc: {source: megatron, preset: mixtral, tensor_parallel: 2, config: {num_attention_heads: 4, num_key_value_heads: 2}}\n"
        "inputs:\n  x: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 10}\n"
        "cases:\n  - {name: c, baseline: a, candidate: mc, inputs: x, weights: {sync: false}}\n"
    )
    config = load_config(text, tmp_path / "a.yaml")
    with pytest.raises(PrecalignError) as info:
        preflight_case(config, config.cases[0])
    assert "models.mc.tensor_parallel: experts are built at tensor_parallel 1 (allowed: 1)" in str(info.value)


@pytest.mark.parametrize(
    ("preset", "options", "fragment"),
    [
        ("llama", "expert_parallel: 2", "models.mc.expert_parallel: preset 'llama' has no experts (allowed: 1)"),
        ("mixtral", "expert_parallel: 3", "models.mc.expert_parallel: 3 must divide the number of experts (8)"),
        ("mixtral", "expert_parallel: 2, pipeline_parallel: 2",
         "models.mc.pipeline_parallel: expert_parallel runs at pipeline_parallel 1 (allowed: 1)"),
        ("mixtral", "expert_parallel: 2, launch: {nproc: 4}",
         "launch.nproc: 4 ranks cannot hold tensor_parallel 1 x pipeline_parallel 1 x expert_parallel 2: "
         "nproc must be 2"),
    ],
)  # fmt: skip
def test_expert_parallel_errors_are_one_line_naming_the_key(tmp_path, preset, options, fragment):
    text = (
        "version: 1\nmodels:\n  a: {source: factory, factory: 'torch.nn:Identity'}\n"
        f"  mc: {{source: megatron, preset: {preset}, {options}, "
        "config: {num_attention_heads: 4, num_key_value_heads: 2}}\n"
        "inputs:\n  x: {kind: tokens, batch: 1, seq_len: 4, vocab_size: 10}\n"
        "cases:\n  - {name: c, baseline: a, candidate: mc, inputs: x, weights: {sync: false}}\n"
    )
    with pytest.raises(PrecalignError) as info:
        config = load_config(text, tmp_path / "a.yaml")
        preflight_case(config, config.cases[0])
    assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_expert_parallel_rank_experts_are_renamed_to_their_global_index():
    from pytest_precalign.parallel.merge import globalize_expert

    name = "decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"
    assert globalize_expert(name, 1, 2) == "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight"
    assert globalize_expert(name, 0, 2) == name
    assert globalize_expert("decoder.layers.1.mlp.router", 1, 2) == "decoder.layers.1.mlp.router"
    assert globalize_expert("x.local_experts.12", 3, 4) == "x.local_experts.24"
