"""A hand-written Qwen2 port in plain torch (the ``factory`` family of benchmarks/mutations.py).

Module names follow Hugging Face's Qwen2ForCausalLM, so weights sync without a mapping. ``bug``
seeds one mistake a porter could make, in ``layer``; ``bug=None`` is the faithful port.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

BUGS = (
    "norm_no_eps",
    "rope_interleaved",
    "rope_base",
    "attn_scale",
    "mask_noncausal",
    "act_gelu",
    "softmax_bf16",
    "residual_dropped",
    "gqa_repeat_wrong",
)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, bug: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = 0.0 if bug else eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:  # the GPT-J pairing, applied to weights laid out for the NeoX one
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any], bug: str | None) -> None:
        super().__init__()
        hidden, self.heads, self.kv = (
            cfg["hidden_size"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
        )
        self.head_dim = hidden // self.heads
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(hidden, self.kv * self.head_dim, bias=True)
        self.v_proj = nn.Linear(hidden, self.kv * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.bug = bug

    def _kv(self, t: torch.Tensor) -> torch.Tensor:
        rep = self.heads // self.kv
        if self.bug == "gqa_repeat_wrong":  # tiles the KV heads instead of repeating each
            return t.repeat(1, rep, 1, 1)
        return t.repeat_interleave(rep, dim=1)

    def forward(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> Any:
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        inter = self.bug == "rope_interleaved"
        q, k = q * cos + _rotate_half(q, inter) * sin, k * cos + _rotate_half(k, inter) * sin
        k, v = self._kv(k), self._kv(v)
        scale = self.head_dim**-1.0 if self.bug == "attn_scale" else self.head_dim**-0.5
        scores = torch.matmul(q, k.transpose(2, 3)) * scale
        if self.bug != "mask_noncausal":
            causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(causal, torch.finfo(scores.dtype).min)
        if self.bug == "softmax_bf16":
            probs = F.softmax(scores.bfloat16(), dim=-1).to(q.dtype)
        else:
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, -1)
        return self.o_proj(out), probs


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, bug: str | None) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn: nn.Module = nn.GELU() if bug == "act_gelu" else nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], bug: str | None) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.self_attn = Attention(cfg, bug)
        self.mlp = MLP(hidden, cfg["intermediate_size"], bug)
        self.input_layernorm = RMSNorm(hidden, eps, bug == "norm_no_eps")
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.bug = bug

    def forward(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        attn, _ = self.self_attn(self.input_layernorm(hidden_states), position_embeddings)
        h = attn if self.bug == "residual_dropped" else hidden_states + attn
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, cfg: dict[str, Any], bug: str | None, layer: int) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], hidden)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, bug if i == layer else None) for i in range(cfg["num_hidden_layers"])
        )
        self.norm = RMSNorm(hidden, cfg["rms_norm_eps"])
        base = cfg["rope_theta"] * (0.1 if bug == "rope_base" else 1.0)
        self.rotary_emb = Rotary(hidden // cfg["num_attention_heads"], base)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=h.device).unsqueeze(0)
        pe = self.rotary_emb(h, positions)
        for layer in self.layers:
            h = layer(h, position_embeddings=pe)
        return {"last_hidden_state": self.norm(h)}


class Qwen2Port(nn.Module):
    def __init__(self, cfg: dict[str, Any], bug: str | None, layer: int) -> None:
        super().__init__()
        self.model = Model(cfg, bug, layer)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, input_ids: torch.Tensor, **_: Any) -> dict[str, torch.Tensor]:
        return {"logits": self.lm_head(self.model(input_ids)["last_hidden_state"])}


def build(config: dict[str, Any], bug: str | None = None, layer: int = 0) -> nn.Module:
    """The port of ``config`` (HF Qwen2 config fields) with ``bug`` seeded in ``layer``."""
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r} (allowed: {', '.join(BUGS)})")
    cfg = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, **config}
    return Qwen2Port(cfg, bug, layer)
