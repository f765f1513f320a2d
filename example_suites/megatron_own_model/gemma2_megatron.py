"""A Gemma2-like model built from megatron-core's building blocks: the user's own code, for a
family no ``source: megatron`` preset builds.

What Gemma2 adds over the Llama-like preset families, each written here on top of
megatron-core's local layer spec (no Transformer Engine, no apex):

- RMSNorm scaling by ``1 + w`` (weights start at 0), computed in float32: ``Gemma2RMSNorm``;
- four norms a layer: the input and pre-MLP norms Megatron has, plus a norm after attention and
  one after the MLP, before each residual add: ``Gemma2TransformerLayer``;
- attention logits soft-capped, ``cap * tanh(scores / cap)``, before the mask and the softmax,
  every other layer (the first, third, ...) attending within a sliding window:
  ``SoftCappedSoftmax`` in ``Gemma2CoreAttention``;
- the attention scale from ``query_pre_attn_scalar`` instead of the head size
  (megatron-core's ``softmax_scale``), ``head_dim`` free of hidden / heads (``kv_channels``);
- the embeddings multiplied by ``sqrt(hidden_size)``: ``ScaledEmbedding``;
- the logits soft-capped by ``final_logit_softcapping``: ``Gemma2GPTModel``;
- GeGLU (``gelu`` with the tanh approximation) as the gated MLP's activation, tied embeddings.

``build(**config)`` takes the fields of Hugging Face's ``Gemma2Config`` (the suite passes the
same dict to both models) and must run inside megatron-core's parallel state: the model's
``runtime: megatron`` in align.yaml has the tool set it up.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import VocabParallelEmbedding
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.transformer.utils import attention_mask_func

# Gemma2Config's defaults for the fields this model reads (the suite's config overrides them).
DEFAULTS: dict[str, Any] = {
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "query_pre_attn_scalar": 256,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "sliding_window": 4096,
    "tie_word_embeddings": True,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
}
# Fields that do not change the model built here.
IGNORED = {
    "attention_dropout",
    "initializer_range",
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
}
# What this model builds; anything else in the config is refused, not guessed.
KNOWN = {
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "layer_types",
    *DEFAULTS,
}


class Gemma2RMSNorm(torch.nn.Module):
    """``x / rms(x) * (1 + w)`` in float32, cast back: Gemma's norm (built by megatron-core's
    ``build_module`` with ``config``, ``hidden_size`` and ``eps``)."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **_: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class SoftCappedSoftmax(torch.nn.Module):
    """Megatron's ``scale_mask_softmax`` for Gemma2: soft-cap the raw scores, mask (the causal
    mask given, and the sliding window on a sliding layer), softmax in float32."""

    def __init__(self, softcap: float | None, window: int | None) -> None:
        super().__init__()
        self.softcap = softcap
        self.window = window

    def forward(
        self, scores: torch.Tensor, mask: torch.Tensor | None, softmax_offset: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        sq, sk = scores.shape[-2:]
        if self.window is not None:  # query i sees keys j with i - j < window
            rows = torch.arange(sq, device=scores.device)[:, None]
            cols = torch.arange(sk, device=scores.device)[None, :]
            far = (rows - cols) >= self.window
            mask = far if mask is None else mask | far
        if mask is not None:
            scores = attention_mask_func(scores.clone(), mask)
        return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


class Gemma2CoreAttention(DotProductAttention):
    """megatron-core's local attention (scores scaled by ``config.softmax_scale``) with
    Gemma2's soft-capped, windowed softmax (``softcap``, ``window``, ``layer_types``: the
    spec's params)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        *args: Any,
        softcap: float | None,
        window: int | None,
        layer_types: list[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(config, layer_number, *args, **kwargs)
        sliding = layer_types[layer_number - 1] == "sliding_attention"
        self.scale_mask_softmax = SoftCappedSoftmax(softcap, window if sliding else None)


def _post_norm_add(norm: torch.nn.Module) -> Any:
    """A bias-dropout-add (megatron-core's ``bda(training, fused)(x_with_bias, residual, p)``)
    that normalises the sublayer's output before the residual add."""

    def bda(training: bool, fused: bool) -> Any:
        def add(
            x_with_bias: tuple[torch.Tensor, torch.Tensor | None], residual: torch.Tensor, p: float
        ) -> Any:
            x, bias = x_with_bias
            if bias is not None:
                x = x + bias
            return residual + torch.nn.functional.dropout(norm(x), p=p, training=training)

        return add

    return bda


class Gemma2TransformerLayer(TransformerLayer):
    """megatron-core's TransformerLayer with Gemma2's two extra norms: after attention
    (``post_self_attn_layernorm``) and after the MLP (``post_mlp_layernorm``)."""

    def __init__(self, config: TransformerConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        eps = config.layernorm_epsilon
        self.post_self_attn_layernorm = Gemma2RMSNorm(config, config.hidden_size, eps)
        self.post_mlp_layernorm = Gemma2RMSNorm(config, config.hidden_size, eps)
        self.self_attn_bda = _post_norm_add(self.post_self_attn_layernorm)
        self.mlp_bda = _post_norm_add(self.post_mlp_layernorm)


class ScaledEmbedding(VocabParallelEmbedding):
    """Word embeddings times ``sqrt(hidden_size)``, in the weights' dtype (as Gemma2's)."""

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        out = super().forward(input_)
        return out * torch.tensor(self.embedding_dim**0.5, dtype=out.dtype)


class Gemma2GPTModel(GPTModel):
    """GPTModel with Gemma2's scaled embeddings and soft-capped logits."""

    def __init__(self, *args: Any, final_logit_softcapping: float | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.final_logit_softcapping = final_logit_softcapping
        plain = self.embedding.word_embeddings
        scaled = ScaledEmbedding(
            plain.num_embeddings,
            plain.embedding_dim,
            init_method=self.config.embedding_init_method,
            config=self.config,
        )
        scaled.weight = plain.weight  # the same parameter: tied to the output layer as before
        self.embedding.word_embeddings = scaled

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("labels") is not None:
            raise ValueError("Gemma2GPTModel returns logits; the loss is computed from them")
        logits: torch.Tensor = super().forward(*args, **kwargs)
        cap = self.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


def _fields(config: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(config) - KNOWN - IGNORED)
    if unknown:
        raise ValueError(
            f"gemma2_megatron.build: unknown config field {unknown[0]!r} (allowed: {', '.join(sorted(KNOWN))})"
        )
    f = {**DEFAULTS, **config}
    f.setdefault("num_key_value_heads", f["num_attention_heads"])
    f.setdefault("head_dim", f["hidden_size"] // f["num_attention_heads"])
    if f.get("layer_types") is None:  # Gemma2Config's: sliding, full, sliding, ...
        f["layer_types"] = [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(f["num_hidden_layers"])
        ]
    if f["hidden_activation"] != "gelu_pytorch_tanh":
        raise ValueError(
            f"gemma2_megatron.build: hidden_activation {f['hidden_activation']!r} (allowed: gelu_pytorch_tanh)"
        )
    return f


def build(**config: Any) -> Gemma2GPTModel:
    """The Gemma2-like GPTModel of an HF-style ``Gemma2Config`` dict, float32, dropout 0."""
    f = _fields(config)
    tc = TransformerConfig(
        num_layers=f["num_hidden_layers"],
        hidden_size=f["hidden_size"],
        ffn_hidden_size=f["intermediate_size"],
        num_attention_heads=f["num_attention_heads"],
        num_query_groups=f["num_key_value_heads"],
        kv_channels=f["head_dim"],
        softmax_scale=f["query_pre_attn_scalar"] ** -0.5,
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=partial(torch.nn.functional.gelu, approximate="tanh"),
        normalization="RMSNorm",
        layernorm_epsilon=float(f["rms_norm_eps"]),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
    )
    local = get_gpt_layer_local_spec(normalization="RMSNorm").submodules
    core = ModuleSpec(
        module=Gemma2CoreAttention,
        params={
            "softcap": f["attn_logit_softcapping"],
            "window": f["sliding_window"],
            "layer_types": list(f["layer_types"]),
        },
    )
    attention = replace(
        local.self_attention, submodules=replace(local.self_attention.submodules, core_attention=core)
    )
    layer = replace(
        local, input_layernorm=Gemma2RMSNorm, self_attention=attention, pre_mlp_layernorm=Gemma2RMSNorm
    )
    spec = ModuleSpec(module=Gemma2TransformerLayer, submodules=layer)
    block = TransformerBlockSubmodules(layer_specs=[spec] * f["num_hidden_layers"], layer_norm=Gemma2RMSNorm)
    return Gemma2GPTModel(
        tc,
        block,
        vocab_size=f["vocab_size"],
        max_sequence_length=f["max_position_embeddings"],
        parallel_output=False,
        share_embeddings_and_output_weights=bool(f["tie_word_embeddings"]),
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=float(f["rope_theta"]),
        final_logit_softcapping=f["final_logit_softcapping"],
    )
