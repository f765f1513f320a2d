"""A tiny Qwen2.5-like model, the same weights for Megatron-core (any TP/PP) and Hugging Face.

``hf_weights()`` makes the full model's weights from a fixed seed, in HF ``Qwen2ForCausalLM``
names; ``megatron_weights()`` is the same model in megatron-core GPTModel names (TP=1, PP=1);
``load_megatron_shard()`` copies one rank's part of it into a model chunk. ``batches()`` are the fixed token batches both training scripts read.
"""

from __future__ import annotations

from typing import Any

import torch

SEED = 1234
CONFIG: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
BATCH, SEQ, LR = 2, 16, 1e-3


def hf_config() -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**CONFIG, hidden_act="silu", attention_dropout=0.0, attn_implementation="eager")


def hf_weights(seed: int = SEED) -> dict[str, torch.Tensor]:
    """Full weights in HF names: normal(0, 0.02) matrices and biases, ones for the norms."""
    c = CONFIG
    h, f, v, d = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["hidden_size"] // 4
    kv = c["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
            p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })  # fmt: skip
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (v, h)})
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.ones(shape) if "norm" in name else torch.randn(shape, generator=gen) * 0.02
        for name, shape in shapes.items()
    }


def megatron_weights(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names -> megatron-core GPTModel (local spec) names, TP=1: q/k/v fused per KV group."""
    groups = CONFIG["num_key_value_heads"]
    out = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
        "output_layer.weight": hf["lm_head.weight"],
    }
    for i in range(CONFIG["num_hidden_layers"]):
        a, m = f"model.layers.{i}.self_attn.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            q, k, v = (hf[f"{a}{x}_proj.{kind}"].chunk(groups) for x in "qkv")
            fused = [t for g in range(groups) for t in (q[g], k[g], v[g])]
            out[f"{m}self_attention.linear_qkv.{kind}"] = torch.cat(fused)
        out[m + "self_attention.linear_proj.weight"] = hf[a + "o_proj.weight"]
        mlp = f"model.layers.{i}.mlp."
        out[m + "mlp.linear_fc1.weight"] = torch.cat(
            [hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"]]
        )
        out[m + "mlp.linear_fc2.weight"] = hf[mlp + "down_proj.weight"]
        out[m + "input_layernorm.weight"] = hf[f"model.layers.{i}.input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[f"model.layers.{i}.post_attention_layernorm.weight"]
    return out


def _tp_slice(name: str, t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    if name.endswith("linear_fc1.weight"):
        gate, up = t.chunk(2)
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    if "linear_qkv" in name or name.endswith(("word_embeddings.weight", "output_layer.weight")):
        return t.chunk(tp)[rank]  # whole KV groups per rank; vocabulary rows
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return t.chunk(tp, 1)[rank]
    return t  # norms: replicated


def load_megatron_shard(chunk: torch.nn.Module, full: dict[str, torch.Tensor], tp: int, tp_rank: int) -> None:
    """Copy this rank's part of the full (TP=1) Megatron weights into one model chunk: its TP
    slices; its layers by their global ``layer_number`` (any PP stage, any virtual chunk)."""
    layers = getattr(getattr(chunk, "decoder", None), "layers", [])
    with torch.no_grad():
        for name, param in chunk.named_parameters():
            full_name = name
            if name.startswith("decoder.layers."):
                local, rest = name.removeprefix("decoder.layers.").split(".", 1)
                full_name = f"decoder.layers.{layers[int(local)].layer_number - 1}.{rest}"
            param.copy_(_tp_slice(name, full[full_name], tp, tp_rank))


def batches(steps: int, seed: int = SEED) -> torch.Tensor:
    """[steps, batch, seq + 1] token ids: inputs are ``[:, :-1]``, labels ``[:, 1:]``."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, CONFIG["vocab_size"], (steps, BATCH, SEQ + 1), generator=gen)
