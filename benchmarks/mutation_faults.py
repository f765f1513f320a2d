"""Seeded faults for benchmarks/mutations.py, applied to a built candidate through the config's
``patch: "mutation_faults:<name>"``. Each wraps or patches one module: forward hooks that
perturb, a replaced forward, a custom autograd Function for backward-only faults, a wrapped
optimizer step (a global step hook that acts only on this model's parameters)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

Patch = Callable[[torch.nn.Module], None]


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming grad by ``scale`` (NaN: poisons one element)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.scale != ctx.scale:  # NaN
            grad = grad.clone()
            grad.view(-1)[3] = float("nan")
            return grad, None
        return grad * ctx.scale, None


def _get(model: torch.nn.Module, name: str) -> torch.nn.Module:
    return model.get_submodule(name)


def _out_hook(name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> Patch:
    def patch(model: torch.nn.Module) -> None:
        def hook(_m: Any, _i: Any, out: Any) -> Any:
            if isinstance(out, tuple):
                return (fn(out[0]), *out[1:])
            return fn(out)

        _get(model, name).register_forward_hook(hook)

    return patch


def _poison(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[5] = value
        return t

    return fn


def _linear_fault(name: str, kind: str, arg: float = 1.1) -> Patch:
    """Replace a Linear's forward: input grad scaled, weight grad scaled, bf16/fp16 compute, no bias."""

    def patch(model: torch.nn.Module) -> None:
        lin = _get(model, name)

        def forward(x: torch.Tensor) -> Any:
            w, b = lin.weight, lin.bias
            if kind == "grad_in":
                return F.linear(_ScaleGrad.apply(x, arg), w, b)
            if kind == "grad_w":
                return F.linear(x, _ScaleGrad.apply(w, arg), b)
            if kind in ("bf16", "fp16"):
                dt = torch.bfloat16 if kind == "bf16" else torch.float16
                return F.linear(x.to(dt), w.to(dt), None if b is None else b.to(dt)).to(x.dtype)
            if kind == "w_transposed":
                return F.linear(x, w.t(), b)
            raise ValueError(kind)

        lin.forward = forward  # type: ignore[method-assign]

    return patch


def _module_grad_in(name: str, scale: float) -> Patch:
    """Any module: its input's grad is scaled in backward (forward unchanged)."""

    def patch(model: torch.nn.Module) -> None:
        mod = _get(model, name)
        original = mod.forward

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return original(_ScaleGrad.apply(x, scale), *args, **kwargs)

        mod.forward = forward  # type: ignore[method-assign]

    return patch


def _hf_attn(layer: int, change: str) -> Patch:
    """Replace an HF eager attention's forward with one whose scale, mask, rope or softmax is wrong."""

    def patch(model: torch.nn.Module) -> None:
        from transformers.models.qwen2 import modeling_qwen2 as m

        attn = _get(model, f"model.layers.{layer}.self_attn")
        if change == "scale":
            attn.scaling = attn.head_dim**-1.0  # type: ignore[union-attr,operator]
            return
        original = attn.forward

        def forward(
            hidden_states: torch.Tensor, position_embeddings: Any, attention_mask: Any, **kw: Any
        ) -> Any:
            if change == "mask_none":
                attention_mask = None
            elif change == "mask_shift" and attention_mask is not None:
                attention_mask = torch.roll(attention_mask, shifts=1, dims=-1)
            elif change == "rope_sin_sign":
                cos, sin = position_embeddings
                position_embeddings = (cos, -sin)
            return original(hidden_states, position_embeddings, attention_mask, **kw)

        attn.forward = forward  # type: ignore[method-assign]
        if change == "softmax_bf16":
            real = F.softmax

            def eager(module: Any, q: Any, k: Any, v: Any, mask: Any, scaling: float, **kw: Any) -> Any:
                kk = m.repeat_kv(k, module.num_key_value_groups)
                vv = m.repeat_kv(v, module.num_key_value_groups)
                w = torch.matmul(q, kk.transpose(2, 3)) * scaling
                if mask is not None:
                    w = w + mask
                w = real(w.bfloat16(), dim=-1).to(q.dtype)
                return torch.matmul(w, vv).transpose(1, 2).contiguous(), w

            attn.forward = functools.partial(_with_interface, original, eager)  # type: ignore[method-assign]

    return patch


def _with_interface(original: Callable[..., Any], eager: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    from transformers.models.qwen2 import modeling_qwen2 as m

    saved = m.eager_attention_forward
    m.eager_attention_forward = eager
    try:
        return original(*a, **kw)
    finally:
        m.eager_attention_forward = saved


def _replace_forward(name: str, make: Callable[[torch.nn.Module], Callable[..., Any]]) -> Patch:
    def patch(model: torch.nn.Module) -> None:
        mod = _get(model, name)
        mod.forward = make(mod)  # type: ignore[method-assign]

    return patch


def _norm_eps(name: str, eps: float) -> Patch:
    def patch(model: torch.nn.Module) -> None:
        mod = _get(model, name)
        for attr in ("variance_epsilon", "eps"):
            if hasattr(mod, attr):
                setattr(mod, attr, eps)

    return patch


def _hf_norm_offset(mod: torch.nn.Module) -> Callable[..., Any]:
    def forward(x: torch.Tensor) -> torch.Tensor:  # Gemma's (1 + w) convention on Qwen2 weights
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + mod.variance_epsilon)  # type: ignore[operator]
        return (1.0 + mod.weight) * h.to(x.dtype)  # type: ignore[operator]

    return forward


def _hf_rope_base(mod: torch.nn.Module) -> Callable[..., Any]:
    original = mod.forward

    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        return original(x, position_ids * 2)  # positions counted twice as fast (wrong base/scale)

    return forward


def _hf_residual_dropped(mod: torch.nn.Module) -> Callable[..., Any]:
    def forward(hidden_states: torch.Tensor, **kw: Any) -> torch.Tensor:
        h = mod.input_layernorm(hidden_states)
        kw.pop("use_cache", None)
        attn, _ = mod.self_attn(hidden_states=h, **kw)
        h = attn  # the bug: the attention residual is dropped
        return h + mod.mlp(mod.post_attention_layernorm(h))

    return forward


def _act(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.nn.Module], Callable[..., Any]]:
    return lambda _mod: fn


def _megatron_mlp_act(layer: int) -> Patch:
    def patch(model: torch.nn.Module) -> None:
        mlp = model.decoder.layers[layer].mlp  # type: ignore[union-attr,index]
        mlp.config = copy.copy(mlp.config)  # the config object is shared by every layer
        mlp.config.activation_func = F.gelu
        mlp.activation_func = F.gelu
        mlp.config.bias_activation_fusion = False

    return patch


def _megatron_attn_scale(layer: int) -> Patch:
    def patch(model: torch.nn.Module) -> None:
        core = model.decoder.layers[layer].self_attention.core_attention  # type: ignore[union-attr,index]
        core.scale_mask_softmax.scale = 2.0

    return patch


def _optimizer(param: str, change: str) -> Patch:
    """After each optimizer step on this model, ``param``'s update is doubled, undone or poisoned."""

    def patch(model: torch.nn.Module) -> None:
        target = model.get_parameter(param)
        before: dict[str, torch.Tensor] = {}

        def pre(opt: torch.optim.Optimizer, *_: Any) -> None:
            if any(p is target for g in opt.param_groups for p in g["params"]):
                before["v"] = target.detach().clone()

        def post(opt: torch.optim.Optimizer, *_: Any) -> None:
            if "v" not in before or not any(p is target for g in opt.param_groups for p in g["params"]):
                return
            old = before.pop("v")
            with torch.no_grad():
                if change == "double_lr":
                    target.copy_(old + 2 * (target - old))
                elif change == "skipped":
                    target.copy_(old)
                elif change == "nan":
                    target.view(-1)[7] = float("nan")

        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(pre)
        register_optimizer_step_post_hook(post)

    return patch


def _tp_fc1_swapped_on_rank1(layer: int) -> Patch:
    """On tensor-parallel rank 1, layer ``layer``'s fc1 shard holds [up_r; gate_r] instead of
    [gate_r; up_r] (a loader that got the shard's halves the wrong way round); rank 0 is right."""

    def patch(model: torch.nn.Module) -> None:
        from megatron.core import parallel_state

        fc1 = model.decoder.layers[layer].mlp.linear_fc1  # type: ignore[union-attr,index]
        done: list[bool] = []

        def pre(_m: Any, _a: Any) -> None:
            if done or parallel_state.get_tensor_model_parallel_rank() != 1:
                return
            done.append(True)
            with torch.no_grad():
                w = fc1.weight
                half = w.shape[0] // 2
                w.copy_(torch.cat((w[half:], w[:half])))

        fc1.register_forward_pre_hook(pre)

    return patch


def _nan(name: str) -> Patch:
    return _out_hook(name, _poison(float("nan")))


def _inf(name: str) -> Patch:
    return _out_hook(name, _poison(float("inf")))


L = "model.layers"
D = "decoder.layers"
FAULTS: dict[str, Patch] = {
    # Hugging Face Qwen2 candidate
    "hf_norm_eps": _norm_eps(f"{L}.0.input_layernorm", 1e-1),
    "hf_norm_offset": _replace_forward(f"{L}.1.post_attention_layernorm", _hf_norm_offset),
    "hf_final_norm_eps": _norm_eps("model.norm", 1e-1),
    "hf_rope_positions": _replace_forward("model.rotary_emb", _hf_rope_base),
    "hf_rope_sin_sign": _hf_attn(1, "rope_sin_sign"),
    "hf_attn_scale": _hf_attn(0, "scale"),
    "hf_mask_none": _hf_attn(1, "mask_none"),
    "hf_mask_shift": _hf_attn(0, "mask_shift"),
    "hf_softmax_bf16": _hf_attn(1, "softmax_bf16"),
    "hf_act_gelu": _replace_forward(f"{L}.0.mlp.act_fn", _act(F.gelu)),
    "hf_act_relu": _replace_forward(f"{L}.1.mlp.act_fn", _act(F.relu)),
    "hf_down_bf16": _linear_fault(f"{L}.1.mlp.down_proj", "bf16"),
    "hf_lm_head_fp16": _linear_fault("lm_head", "fp16"),
    "hf_o_proj_transposed": _linear_fault(f"{L}.0.self_attn.o_proj", "w_transposed"),
    "hf_embed_scaled": _out_hook("model.embed_tokens", lambda t: t * 8.0),
    "hf_up_tiny": _out_hook(f"{L}.1.mlp.up_proj", lambda t: t * (1 + 1e-3)),
    "hf_residual_dropped": _replace_forward(f"{L}.1", _hf_residual_dropped),
    "hf_nan_up": _nan(f"{L}.1.mlp.up_proj"),
    "hf_inf_o_proj": _inf(f"{L}.0.self_attn.o_proj"),
    "hf_bwd_down_grad_in": _linear_fault(f"{L}.1.mlp.down_proj", "grad_in", 1.1),
    "hf_bwd_q_weight_grad": _linear_fault(f"{L}.1.self_attn.q_proj", "grad_w", 0.5),
    "hf_bwd_norm_grad_in": _module_grad_in(f"{L}.1.input_layernorm", 0.9),
    "hf_bwd_lm_head_nan": _linear_fault("lm_head", "grad_in", float("nan")),
    "hf_opt_double_lr": _optimizer(f"{L}.1.mlp.down_proj.weight", "double_lr"),
    "hf_opt_skipped": _optimizer(f"{L}.0.self_attn.q_proj.bias", "skipped"),
    "hf_opt_nan": _optimizer("lm_head.weight", "nan"),
    # megatron-core GPTModel candidate (names in the Megatron model; expected origins in HF's)
    "mg_mlp_scale": _out_hook(f"{D}.1.mlp", lambda t: t * 1.1),
    "mg_norm_eps": _norm_eps(f"{D}.0.input_layernorm", 1e-1),
    "mg_attn_scale": _megatron_attn_scale(0),
    "mg_act_gelu": _megatron_mlp_act(1),
    "mg_fc2_bf16": _out_hook(f"{D}.0.mlp.linear_fc2", lambda t: t.bfloat16().to(t.dtype)),
    "mg_final_norm_nan": _nan("decoder.final_layernorm"),
    "mg_bwd_fc2_grad_in": _module_grad_in(f"{D}.1.mlp.linear_fc2", 1.1),
    "mg_opt_double_lr": _optimizer(f"{D}.0.mlp.linear_fc2.weight", "double_lr"),
    "mg_tp_fc1_shard": _tp_fc1_swapped_on_rank1(0),
    # the hand-written port
    "port_bwd_o_proj_grad_in": _linear_fault(f"{L}.0.self_attn.o_proj", "grad_in", 0.9),
    "port_opt_skipped": _optimizer("model.norm.weight", "skipped"),
    # fault-free companions
    "hf_recompute": lambda m: m.gradient_checkpointing_enable(),  # type: ignore[operator]
}


def __getattr__(name: str) -> Patch:
    try:
        return FAULTS[name]
    except KeyError:
        raise AttributeError(name) from None
