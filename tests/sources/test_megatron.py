"""Megatron-core GPTModel vs HF Qwen2: the preset mapping, weight round trips, the example
suite, and faults injected into the Megatron side (normal and isolation mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.run.case import run_case

pytest.importorskip("megatron.core")

CONFIG = """
version: 1
models:
  hf:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: &c {vocab_size: 1000, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, rope_theta: 1000000.0,
                max_position_embeddings: 128, tie_word_embeddings: false}
  mc: {source: megatron, config: *c}
  mc_faulty: {source: megatron, config: *c, patch: "their_faults:%(patch)s"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 16, vocab_size: 1000, seed: 5, labels: true}
tolerances:
  t:
    - {match: "*", phase: forward, atol: 1.0e-6, rtol: 0, why: fp32 forward}
    - {match: "*", atol: 1.0e-6, rtol: 1.0e-5, why: fp32 grads}
cases:
  - {name: c, baseline: hf, candidate: %(candidate)s, inputs: toks, mapping: "preset:megatron-qwen2.5",
     phases: [forward, backward], record: {mode: tensor}, tolerances: t, isolate: %(isolate)s}
"""

# Written as a user of the tool would: their own faults, patched into the Megatron model.
THEIR_FAULTS = '''
import torch

def _wrap(module, fn):
    original = module.forward
    module.forward = lambda *a, **k: fn(original(*a, **k))

def o_proj_noise(model):
    """Adds a constant inside layer 0's attention output projection (RowParallelLinear)."""
    _wrap(model.decoder.layers[0].self_attention.linear_proj, lambda out: (out[0] + 0.01, out[1]))

def context_scale(model):
    """Scales the attention context inside layer 0's self-attention, between its submodules."""
    _wrap(model.decoder.layers[0].self_attention.core_attention, lambda out: out * 1.05)
'''


def _run(
    tmp_path: Path,
    candidate: str = "mc",
    patch: str = "o_proj_noise",
    isolate: bool = False,
    mode: str = "tensor",
):
    (tmp_path / "their_faults.py").write_text(THEIR_FAULTS)
    text = CONFIG % {"candidate": candidate, "patch": patch, "isolate": str(isolate).lower()}
    text = text.replace("record: {mode: tensor}", f"record: {{mode: {mode}}}")
    config = load_config(text, tmp_path / "align.yaml")
    return run_case(config, config.cases[0])


def test_aligned_pair_compares_every_shared_module_exactly(tmp_path):
    run = _run(tmp_path, isolate=True)
    forward, backward = run.verdicts["forward"], run.verdicts["backward"]
    assert forward.passed and backward.passed
    worst = max(
        p.closeness.greatest_abs
        for p in run.comparison.pairs
        if p.record.kind == "activation" and p.closeness is not None
    )
    assert worst <= 1e-6
    # Every module of both models is paired; what is one-sided says why.
    for verdict in (forward, backward):
        assert verdict.only_baseline or verdict.only_candidate
        unexplained = [
            r.id for r in (*verdict.only_baseline, *verdict.only_candidate) if not verdict.reasons.get(r.id)
        ]
        assert unexplained == []
    names = {
        p.record.name
        for p in run.comparison.pairs
        if p.paired and p.record.kind in ("activation", "logits", "loss")
    }
    for layer in (0, 1):
        for module in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
            "post_attention_layernorm",
            "self_attn",
            "mlp",
            "",
        ):
            assert f"model.layers.{layer}.{module}".rstrip(".") in names
    assert {"model.embed_tokens", "model.norm", "lm_head", "logits", "loss"} <= names
    # Isolation found no module that diverges on identical inputs.
    assert forward.isolated_count > 20 and forward.isolated_origin is None


def test_weights_round_trip_hf_megatron_hf_bitwise(tmp_path):
    from pytest_precalign.mapping.spec import reverse
    from pytest_precalign.mapping.weights import sync_weights
    from pytest_precalign.sources import build_model, runtime

    config = load_config(CONFIG % {"candidate": "mc", "patch": "x", "isolate": "false"}, tmp_path / "a.yaml")
    mapping = config.cases[0].mapping
    assert mapping is not None
    hf_spec, mc_spec = config.models["hf"], config.models["mc"]
    with runtime(mc_spec):
        hf = build_model(hf_spec, tmp_path).module
        with torch.no_grad():  # HF initialises biases to 0 and norms to 1: randomise them all
            for p in hf.parameters():
                p.copy_(torch.randn_like(p))
        mc = build_model(mc_spec, tmp_path).module
        forward = sync_weights(hf, mc, mapping, strict=True)
        assert forward.unsynced == () and forward.unused == ()
        assert forward.transformed == 2 * 3  # per layer: qkv weight, qkv bias, fc1 weight
        back = build_model(hf_spec, tmp_path).module
        report = sync_weights(mc, back, reverse(mapping), strict=True)
        assert report.unsynced == () and report.unused == ()
    for name, param in hf.named_parameters():
        assert torch.equal(param, dict(back.named_parameters())[name]), name


def test_fault_in_megatron_module_is_found_with_its_origin(tmp_path):
    run = _run(tmp_path, candidate="mc_faulty", patch="o_proj_noise")
    first = run.verdicts["forward"].first
    assert first is not None
    assert (first.name, first.kind, first.origin) == ("model.layers.0.self_attn.o_proj", "activation", True)


def test_stats_mode_pair_passes_and_still_finds_the_fault(tmp_path):
    """Statistics survive the [s, b, h] -> [b, s, h] layout change; fused q/k/v cannot be split,
    so HF's q/k/v statistics are merged against them (``merged_stats``)."""
    aligned = _run(tmp_path, mode="stats")
    for phase in ("forward", "backward"):
        verdict = aligned.verdicts[phase]
        assert verdict.passed, [(p.record.name, p.note, p.checks) for p in verdict.failures][:3]
        evidence = {
            p.evidence
            for p in aligned.comparison.pairs
            if p.paired and p.record.phase == phase and p.record.kind != "input"
        }
        assert evidence == {"stats", "merged_stats"}, evidence
    faulty = _run(tmp_path, candidate="mc_faulty", mode="stats")
    first = faulty.verdicts["forward"].first
    assert first is not None and (first.name, first.origin, first.evidence) == (
        "model.layers.0.self_attn.o_proj",
        True,
        "stats",
    )


def test_fault_in_megatron_module_isolated(tmp_path):
    run = _run(tmp_path, candidate="mc_faulty", patch="o_proj_noise", isolate=True)
    verdict = run.verdicts["forward"]
    assert verdict.first is not None and verdict.first.origin
    assert verdict.isolated_origin is not None
    assert verdict.isolated_origin.record.name == "model.layers.0.self_attn.o_proj"


def test_fault_between_submodules_isolation_names_the_parent(tmp_path):
    normal = _run(tmp_path, candidate="mc_faulty", patch="context_scale")
    first = normal.verdicts["forward"].first
    assert first is not None
    # core_attention has no HF module: the first compared divergence is o_proj, whose input
    # (the attention context) already differs.
    assert (first.name, first.origin, first.origin_module) == (
        "model.layers.0.self_attn.o_proj",
        False,
        "model.layers.0.self_attn",
    )
    isolated = _run(tmp_path, candidate="mc_faulty", patch="context_scale", isolate=True)
    verdict = isolated.verdicts["forward"]
    assert verdict.first is not None and verdict.first.isolated is not None
    assert verdict.first.isolated.passed  # o_proj is fine on the baseline's inputs
    assert verdict.first.origin is False
    assert verdict.isolated_origin is not None
    assert verdict.isolated_origin.record.name == "model.layers.0.self_attn"


def test_megatron_config_errors_name_the_key(tmp_path):
    from pytest_precalign.errors import ConfigError
    from pytest_precalign.run.case import preflight_case

    bad = CONFIG.replace(
        "mc: {source: megatron, config: *c}", "mc: {source: megatron, config: *c, preset: deepseek}"
    )
    with pytest.raises(
        ConfigError,
        match=r"models.mc.preset: unknown value 'deepseek' \(allowed: qwen2.5, llama, qwen3, mixtral, qwen3-moe\)",
    ):
        load_config(bad % {"candidate": "mc", "patch": "x", "isolate": "false"}, tmp_path / "a.yaml")
    odd = CONFIG.replace("num_key_value_heads: 2,", "num_key_value_heads: 3,")
    with pytest.raises(
        ConfigError,
        match=r"cases\[0\].mapping: preset:megatron-qwen2.5 does not fit these models: num_heads \(4\) must be a multiple of num_kv_heads \(3\)",
    ):
        load_config(odd % {"candidate": "mc", "patch": "x", "isolate": "false"}, tmp_path / "a.yaml")
    no_map = odd.replace(' mapping: "preset:megatron-qwen2.5",', "")
    config = load_config(no_map % {"candidate": "mc", "patch": "x", "isolate": "false"}, tmp_path / "a.yaml")
    from pytest_precalign.errors import PrecalignError

    with pytest.raises(
        PrecalignError, match="num_attention_heads .4. must be a multiple of num_key_value_heads .3."
    ):
        preflight_case(config, config.cases[0])
    iso = CONFIG.replace("record: {mode: tensor}", "record: {mode: stats}")
    with pytest.raises(ConfigError, match=r"isolate: isolation re-runs modules on the baseline's tensors"):
        load_config(iso % {"candidate": "mc", "patch": "x", "isolate": "true"}, tmp_path / "a.yaml")
