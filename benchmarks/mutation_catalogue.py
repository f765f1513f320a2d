"""The seeded mutations and fault-free pairs of benchmarks/mutations.py, and the align.yaml
that runs them all in one pytest session."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

PRESET = "preset:megatron-qwen2.5"
TINY: dict[str, Any] = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1.0e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
FWD_BWD = ["forward", "backward"]
ALL = ["forward", "backward", "step"]


@dataclass(frozen=True)
class Case:
    """One case of the suite: a mutation (``expected`` names its origin module, as the
    baseline names it) or a fault-free pair (``expected`` is None)."""

    name: str
    family: str  # hf | factory | megatron
    fault: str  # forward | backward | optimizer | mapping | tp | clean
    what: str
    baseline: str
    candidate: str | dict[str, Any]
    expected: str | None = None
    phases: list[str] = field(default_factory=lambda: list(FWD_BWD))
    extra: dict[str, Any] = field(default_factory=dict)
    launched: bool = False


def _hf(attn: str = "eager", dtype: str | None = None, patch: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": "hf",
        "class": "transformers.Qwen2ForCausalLM",
        "attn_implementation": attn,
        "config": TINY,
    }
    if dtype:
        spec["dtype"] = dtype
    if patch:
        spec["patch"] = f"mutation_faults:{patch}"
    return spec


def _port(
    bug: str | None = None, layer: int = 0, patch: str | None = None, dtype: str | None = None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"config": TINY, "layer": layer}
    if bug:
        kwargs["bug"] = bug
    spec: dict[str, Any] = {"source": "factory", "factory": "mutation_port:build", "kwargs": kwargs}
    if patch:
        spec["patch"] = f"mutation_faults:{patch}"
    if dtype:
        spec["dtype"] = dtype
    return spec


def _mg(patch: str | None = None, dtype: str | None = None, tp: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {"source": "megatron", "preset": "qwen2.5", "config": TINY}
    if patch:
        spec["patch"] = f"mutation_faults:{patch}"
    if dtype:
        spec["dtype"] = dtype
    if tp:
        spec["tensor_parallel"] = tp
        spec["launch"] = {"nproc": tp}
    return spec


L = "model.layers"
OPT = {"phases": ALL, "extra": {"steps": 1}}


def _hf_mut(name: str, what: str, expected: str, fault: str = "forward", **kw: Any) -> Case:
    return Case(name, "hf", fault, what, "hf", _hf(patch=name), expected, **kw)


def _port_mut(bug: str, layer: int, what: str, expected: str) -> Case:
    return Case(f"port_{bug}", "factory", "forward", what, "hf", _port(bug, layer), expected)


def _mg_mut(name: str, what: str, expected: str, fault: str = "forward", **kw: Any) -> Case:
    return Case(
        name,
        "megatron",
        fault,
        what,
        "hf",
        _mg(patch=name),
        expected,
        extra={"mapping": PRESET, **kw.pop("extra", {})},
        **kw,
    )


def mutations() -> list[Case]:
    return [
        _hf_mut("hf_norm_eps", "RMSNorm eps 1e-6 -> 0.1", f"{L}.0.input_layernorm"),
        _hf_mut(
            "hf_norm_offset",
            "RMSNorm scales by (1 + w) (Gemma convention)",
            f"{L}.1.post_attention_layernorm",
        ),
        _hf_mut("hf_final_norm_eps", "final RMSNorm eps 1e-6 -> 0.1", "model.norm"),
        _hf_mut("hf_rope_positions", "rotary positions scaled x2", "model.rotary_emb"),
        _hf_mut("hf_rope_sin_sign", "rope applied with -sin (rotation reversed)", f"{L}.1.self_attn"),
        _hf_mut("hf_attn_scale", "attention scale 1/d instead of 1/sqrt(d)", f"{L}.0.self_attn"),
        _hf_mut("hf_mask_none", "causal mask dropped", f"{L}.1.self_attn"),
        _hf_mut("hf_mask_shift", "causal mask shifted by one key", f"{L}.0.self_attn"),
        _hf_mut("hf_softmax_bf16", "attention softmax in bf16", f"{L}.1.self_attn"),
        _hf_mut("hf_act_gelu", "SiLU -> GELU", f"{L}.0.mlp.act_fn"),
        _hf_mut("hf_act_relu", "SiLU -> ReLU", f"{L}.1.mlp.act_fn"),
        _hf_mut("hf_down_bf16", "down_proj computed in bf16", f"{L}.1.mlp.down_proj"),
        _hf_mut("hf_lm_head_fp16", "lm_head computed in fp16", "lm_head"),
        _hf_mut("hf_o_proj_transposed", "o_proj uses its weight transposed", f"{L}.0.self_attn.o_proj"),
        _hf_mut("hf_embed_scaled", "embedding output x8 (Gemma-style sqrt(d) scale)", "model.embed_tokens"),
        _hf_mut("hf_up_tiny", "up_proj output x(1 + 1e-3)", f"{L}.1.mlp.up_proj"),
        _hf_mut("hf_residual_dropped", "attention residual dropped (code between modules)", f"{L}.1"),
        _hf_mut("hf_nan_up", "NaN injected into up_proj output", f"{L}.1.mlp.up_proj"),
        _hf_mut("hf_inf_o_proj", "Inf injected into o_proj output", f"{L}.0.self_attn.o_proj"),
        _hf_mut(
            "hf_bwd_down_grad_in",
            "down_proj grad w.r.t. input x1.1 (backward only)",
            f"{L}.1.mlp.down_proj",
            "backward",
        ),
        _hf_mut(
            "hf_bwd_q_weight_grad",
            "q_proj weight grad x0.5 (backward only)",
            f"{L}.1.self_attn.q_proj",
            "backward",
        ),
        _hf_mut(
            "hf_bwd_norm_grad_in",
            "input_layernorm grad w.r.t. input x0.9",
            f"{L}.1.input_layernorm",
            "backward",
        ),
        _hf_mut("hf_bwd_lm_head_nan", "NaN in lm_head's grad w.r.t. input", "lm_head", "backward"),
        _hf_mut(
            "hf_opt_double_lr", "down_proj.weight update doubled", f"{L}.1.mlp.down_proj", "optimizer", **OPT
        ),
        _hf_mut("hf_opt_skipped", "q_proj.bias not updated", f"{L}.0.self_attn.q_proj", "optimizer", **OPT),
        _hf_mut("hf_opt_nan", "NaN written into lm_head.weight by the step", "lm_head", "optimizer", **OPT),
        Case(
            "hf_map_gate_up",
            "hf",
            "mapping",
            "weights mapped gate <-> up",
            "hf",
            _hf(),
            f"{L}.0.mlp.gate_proj",
            extra={"mapping": "swap_gate_up"},
        ),
        Case(
            "hf_map_q_heads",
            "hf",
            "mapping",
            "q heads 1 and 2 swapped across KV groups in the weight map",
            "hf",
            _hf(),
            f"{L}.0.self_attn.q_proj",
            extra={"mapping": "swap_q_heads"},
        ),
        _port_mut("norm_no_eps", 1, "RMSNorm without eps", f"{L}.1.input_layernorm"),
        _port_mut(
            "rope_interleaved", 0, "rope pairs interleaved (GPT-J) on NeoX weights", f"{L}.0.self_attn"
        ),
        _port_mut("rope_base", 0, "rope base x0.1", "model.rotary_emb"),
        _port_mut("attn_scale", 1, "attention scale 1/d", f"{L}.1.self_attn"),
        _port_mut("mask_noncausal", 0, "no causal mask", f"{L}.0.self_attn"),
        _port_mut("act_gelu", 1, "GELU instead of SiLU", f"{L}.1.mlp.act_fn"),
        _port_mut("softmax_bf16", 0, "softmax in bf16", f"{L}.0.self_attn"),
        _port_mut("residual_dropped", 1, "attention residual dropped", f"{L}.1"),
        _port_mut("gqa_repeat_wrong", 0, "KV heads tiled instead of repeated (GQA)", f"{L}.0.self_attn"),
        Case(
            "port_bwd_o_proj_grad_in",
            "factory",
            "backward",
            "o_proj grad w.r.t. input x0.9",
            "hf",
            _port(patch="port_bwd_o_proj_grad_in"),
            f"{L}.0.self_attn.o_proj",
        ),
        Case(
            "port_opt_skipped",
            "factory",
            "optimizer",
            "final norm weight not updated",
            "hf",
            _port(patch="port_opt_skipped"),
            "model.norm",
            **OPT,
        ),
        _mg_mut("mg_mlp_scale", "MLP output x1.1", f"{L}.1.mlp"),
        _mg_mut("mg_norm_eps", "input_layernorm eps -> 0.1", f"{L}.0.input_layernorm"),
        _mg_mut("mg_attn_scale", "softmax scale 2.0 in core attention", f"{L}.0.self_attn"),
        _mg_mut("mg_act_gelu", "MLP activation gelu instead of swiglu", f"{L}.1.mlp"),
        _mg_mut("mg_fc2_bf16", "linear_fc2 output rounded to bf16", f"{L}.0.mlp.down_proj"),
        _mg_mut("mg_final_norm_nan", "NaN in final_layernorm output", "model.norm"),
        _mg_mut(
            "mg_bwd_fc2_grad_in", "linear_fc2 grad w.r.t. input x1.1", f"{L}.1.mlp.down_proj", "backward"
        ),
        _mg_mut(
            "mg_opt_double_lr",
            "linear_fc2.weight update doubled",
            f"{L}.0.mlp.down_proj",
            "optimizer",
            phases=ALL,
            extra={"steps": 1, "optimizer": {"name": "adamw", "lr": 1.0e-3}},
        ),
        Case(
            "mg_map_gate_up",
            "megatron",
            "mapping",
            "fc1 weight built as [up; gate]",
            "hf",
            _mg(),
            f"{L}.0.mlp.gate_proj",
            extra={"mapping": "mg_swap_gate_up"},
        ),
        Case(
            "mg_map_o_transposed",
            "megatron",
            "mapping",
            "linear_proj weight transposed",
            "hf",
            _mg(),
            f"{L}.0.self_attn.o_proj",
            extra={"mapping": "mg_o_transposed"},
        ),
        Case(
            "mg_tp_fc1_shard",
            "megatron",
            "tp",
            "TP=2: rank 1's fc1 shard is [up_r; gate_r]",
            "hf",
            _mg(patch="mg_tp_fc1_shard", tp=2),
            f"{L}.0.mlp.gate_proj",
            extra={"mapping": PRESET, "tolerances": "fp32_tp2"},
            launched=True,
        ),
    ]


def clean_pairs() -> list[Case]:
    mg = {"mapping": PRESET}
    return [
        Case(
            "clean_eager_vs_sdpa",
            "hf",
            "clean",
            "HF eager vs sdpa",
            "hf",
            _hf("sdpa"),
            phases=ALL,
            extra={"steps": 1},
        ),
        Case(
            "clean_hf_vs_port",
            "factory",
            "clean",
            "HF vs the hand-written port",
            "hf",
            _port(),
            phases=ALL,
            extra={"steps": 1},
        ),
        Case("clean_port_vs_sdpa", "factory", "clean", "port vs HF sdpa", "port", _hf("sdpa")),
        Case(
            "clean_hf_vs_megatron",
            "megatron",
            "clean",
            "HF vs Megatron fp32, 2 AdamW steps",
            "hf",
            _mg(),
            phases=ALL,
            extra={**mg, "steps": 2},
        ),
        Case(
            "clean_megatron_vs_hf",
            "megatron",
            "clean",
            "Megatron baseline vs HF",
            "megatron",
            _hf(),
            extra=mg,
        ),
        Case("clean_port_vs_megatron", "megatron", "clean", "port vs Megatron fp32", "port", _mg(), extra=mg),
        Case(
            "clean_bf16_hf_vs_megatron",
            "megatron",
            "clean",
            "bf16 HF vs Megatron under the bf16 table",
            "hf_bf16",
            _mg(dtype="bfloat16"),
            extra={**mg, "tolerances": "bf16"},
        ),
        Case(
            "clean_bf16_eager_vs_sdpa",
            "hf",
            "clean",
            "bf16 eager vs sdpa under the bf16 table",
            "hf_bf16",
            _hf("sdpa", "bfloat16"),
            extra={"tolerances": "bf16"},
        ),
        Case(
            "clean_bf16_hf_vs_port",
            "factory",
            "clean",
            "bf16 HF vs port under the bf16 table",
            "hf_bf16",
            _port(dtype="bfloat16"),
            extra={"tolerances": "bf16"},
        ),
        Case(
            "clean_recompute",
            "hf",
            "clean",
            "activation recompute vs none",
            "hf",
            _hf(patch="hf_recompute"),
            phases=ALL,
            extra={"steps": 1, "train": True},
        ),
        Case(
            "clean_sgd_two_steps",
            "hf",
            "clean",
            "HF vs HF, 2 SGD steps",
            "hf",
            _hf(),
            phases=ALL,
            extra={"steps": 2, "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}},
        ),
        Case(
            "clean_tp1_vs_tp2",
            "megatron",
            "clean",
            "Megatron TP=1 vs TP=2 (torchrun)",
            "megatron",
            _mg(tp=2),
            extra={"tolerances": "fp32_tp2"},
            launched=True,
        ),
    ]


def _param_swap(a: str, b: str) -> list[dict[str, Any]]:
    return [
        {
            "baseline": [f"{L}.{{i}}.{x}.weight"],
            "candidate": f"{L}.{{i}}.{y}.weight",
            "kinds": ["param"],
            "transform": [],
        }
        for x, y in ((a, b), (b, a))
    ]


def mapping_files(preset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The mapping mistakes, as files a user might write: ``preset`` is the built-in
    megatron-qwen2.5 mapping (parsed), which the Megatron ones start from."""
    q_heads = [
        {"op": "reshape", "shape": [2, 2, 16, 64]},
        {"op": "transpose", "dim0": 0, "dim1": 1},
        {"op": "reshape", "shape": [64, 64]},
    ]
    mg_gate_up = copy.deepcopy(preset)
    for entry in mg_gate_up["tensors"]:
        if entry["baseline"] == [f"{L}.{{i}}.mlp.gate_proj.weight", f"{L}.{{i}}.mlp.up_proj.weight"]:
            entry["baseline"] = entry["baseline"][::-1]
    mg_o = copy.deepcopy(preset)
    mg_o["tensors"].insert(
        0,
        {
            "baseline": [f"{L}.{{i}}.self_attn.o_proj.weight"],
            "candidate": "decoder.layers.{i}.self_attention.linear_proj.weight",
            "kinds": ["param"],
            "transform": [{"op": "transpose", "dim0": 0, "dim1": 1}],
        },
    )
    return {
        "swap_gate_up": {"tensors": _param_swap("mlp.gate_proj", "mlp.up_proj")},
        "swap_q_heads": {
            "tensors": [
                {
                    "baseline": [f"{L}.{{i}}.self_attn.q_proj.weight"],
                    "candidate": f"{L}.{{i}}.self_attn.q_proj.weight",
                    "kinds": ["param"],
                    "transform": q_heads,
                }
            ]
        },
        "mg_swap_gate_up": mg_gate_up,
        "mg_o_transposed": mg_o,
    }


TOLERANCES: dict[str, Any] = {
    "fp32": [
        {"match": "*", "kind": "loss", "atol": 1.0e-6, "rtol": 0, "why": "fp32 loss (measured 0)"},
        {
            "match": "*",
            "kind": ["activation", "logits"],
            "step": 0,
            "atol": 1.0e-6,
            "rtol": 0,
            "why": "fp32 forward, identical weights",
        },
        {
            "match": "*",
            "phase": "backward",
            "atol": 1.0e-6,
            "rtol": 1.0e-5,
            "why": "grads summed in another order",
        },
        {"match": "*", "atol": 2.0e-5, "rtol": 1.0e-4, "why": "after AdamW steps"},
    ],
    "fp32_tp2": [
        {"match": "*", "kind": "loss", "atol": 1.0e-6, "rtol": 0, "why": "measured 0"},
        {
            "match": "*",
            "phase": "forward",
            "step": 0,
            "atol": 5.0e-6,
            "rtol": 0,
            "why": "row-parallel partial sums",
        },
        {"match": "*", "phase": "backward", "atol": 1.0e-6, "rtol": 1.0e-5, "why": "sharded grad sums"},
        {"match": "*", "atol": 2.0e-5, "rtol": 1.0e-4, "why": "after an AdamW step"},
    ],
    "bf16": [
        {"match": "*", "kind": "loss", "atol": 1.0e-2, "rtol": 0, "why": "bf16 loss"},
        {
            "match": "*",
            "atol": 2.0e-2,
            "rtol": 2.0e-2,
            "why": "1-ulp bf16 differences from the first norm on",
        },
    ],
}


def suite(cases: list[Case], mapping_dir: str) -> dict[str, Any]:
    """One align.yaml (as a dict) holding every case; mapping files live in ``mapping_dir``."""
    models: dict[str, Any] = {
        "hf": _hf(),
        "hf_bf16": _hf(dtype="bfloat16"),
        "port": _port(),
        "megatron": _mg(),
    }
    out = []
    for case in cases:
        cand = case.candidate if isinstance(case.candidate, str) else f"cand_{case.name}"
        if not isinstance(case.candidate, str):
            models[cand] = case.candidate
        entry: dict[str, Any] = {
            "name": case.name,
            "baseline": case.baseline,
            "candidate": cand,
            "inputs": "tokens",
            "phases": case.phases,
            "record": {"mode": "tensor"},
            "tolerances": "fp32",
            "optimizer": {"name": "adamw", "lr": 1.0e-3, "weight_decay": 0.01},
        }
        entry.update(case.extra)
        mapping = entry.get("mapping")
        if mapping and not str(mapping).startswith("preset:"):
            entry["mapping"] = f"{mapping_dir}/{mapping}.yaml"
        entry["weights"] = {"sync": True}
        out.append(entry)
    return {
        "version": 1,
        "defaults": {"device": "cpu", "dtype": "float32", "seed": 0, "deterministic": True},
        "models": models,
        "inputs": {
            "tokens": {
                "kind": "tokens",
                "batch": 2,
                "seq_len": 32,
                "vocab_size": 1000,
                "seed": 1,
                "labels": True,
            }
        },
        "tolerances": TOLERANCES,
        "cases": out,
    }
