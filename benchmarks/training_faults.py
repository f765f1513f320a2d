"""Training-machinery faults for ``benchmarks/training_mutations.py``, planted the way a real
framework has them, in one side's megatron-core stack (its ``ChainedOptimizer`` over an
``FP32Optimizer`` over ``torch.optim.AdamW``, its DDP grad buffers, its loss function), never by
editing recorded numbers:

- ``AdamWVariant``: AdamW as apex's ``FusedAdam(adam_w_mode=True)`` computes it, with its
  ``bias_correction`` switch, a step counter that can be off by ``step_offset``, the weight
  decay on every group, from the optimizer's ``from_step``-th update on (before it: torch's
  AdamW to the bit);
  ``swap_optimizer`` puts it in place of a side's torch AdamW, on the same param groups;
- ``reset_step_counter``: every parameter's AdamW step count back to 0 (a resume that restores
  the moments but not the step count);
- ``clip_one_group``: clipping sees the first optimizer group only (its norm and its grads:
  ``clip_grad_norm_(optimizer.param_groups[0]["params"])``);
- ``mean_of_micro_batch_means``: each micro-batch's loss averaged over its own tokens (the step's
  loss the mean of those means) instead of per token over the step;
- ``clip_before_accumulation``: each micro-batch's grads clipped by their own norm as they are
  accumulated, none after;
- ``bf16_grad_buffer``: the grads accumulated in bf16 (the DDP buffer a bf16 model has without
  ``grad_reduce_in_fp32``);
- ``sdpa_attention``: a benign change: megatron-core's ``DotProductAttention`` computed by
  ``torch.nn.functional.scaled_dot_product_attention`` (the same maths, another kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn import functional as F

from pytest_precalign.megatron_core import megatron_stack


class AdamWVariant(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) as torch's single-tensor step computes it, with apex
    ``FusedAdam``'s ``bias_correction`` switch, a step counter ``step_offset`` ahead, and
    ``decay_every_group``: the constructor's weight decay on every group (the no-decay group's
    0 ignored), each from the ``from_step``-th update (counted from 0) on."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        bias_correction: bool = True,
        step_offset: int = 0,
        decay_every_group: bool = False,
        from_step: int = 0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.bias_correction, self.step_offset, self.from_step = bias_correction, step_offset, from_step
        self.decay_every_group = decay_every_group
        self.updates = 0

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        planted = self.updates >= self.from_step
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            decay = (
                self.defaults["weight_decay"] if planted and self.decay_every_group else group["weight_decay"]
            )
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = float(state["step"]) + (self.step_offset if planted else 0)
                _update(
                    p,
                    p.grad,
                    state,
                    {**group, "weight_decay": decay},
                    (beta1, beta2),
                    t,
                    self.bias_correction or not planted,
                )
        self.updates += 1


def _update(
    p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any],
    betas: tuple[float, float], t: float, correct: bool,
) -> None:  # fmt: skip
    """torch's ``_single_tensor_adam`` (decoupled decay, no amsgrad) for one parameter."""
    (beta1, beta2), lr, eps = betas, group["lr"], group["eps"]
    p.mul_(1 - lr * group["weight_decay"])
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**t if correct else 1.0
    bias_correction2 = 1 - beta2**t if correct else 1.0
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))


def _inner(stack: Any) -> list[Any]:
    """The side's megatron-core optimizers under its ChainedOptimizer (one FP32Optimizer here)."""
    return list(getattr(stack.optimizer, "chained_optimizers", [stack.optimizer]))


def swap_optimizer(**variant: Any) -> Callable[[Any], None]:
    """A plant: the side's torch AdamW replaced by ``AdamWVariant(**variant)`` on the same
    param groups (the scheduler keeps setting their LR and weight decay)."""

    def plant(stack: Any) -> None:
        for megatron_optimizer in _inner(stack):
            torch_adamw = megatron_optimizer.optimizer
            assert isinstance(torch_adamw, torch.optim.AdamW), type(torch_adamw)
            settings = {k: torch_adamw.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
            megatron_optimizer.optimizer = AdamWVariant(torch_adamw.param_groups, **settings, **variant)

    return plant


def reset_step_counter(stack: Any) -> None:
    """Every parameter's AdamW step count back to 0, its moments kept."""
    for megatron_optimizer in _inner(stack):
        for state in megatron_optimizer.optimizer.state.values():
            state["step"].zero_()


def clip_one_group(stack: Any) -> None:
    """Clipping (its grad norm and the grads it scales) over the first param group only."""
    for megatron_optimizer in _inner(stack):
        torch_optimizer = megatron_optimizer.optimizer
        megatron_optimizer.get_parameters = lambda o=torch_optimizer: list(o.param_groups[0]["params"])


_PER_TOKEN_LOSS = megatron_stack.per_token_loss


@contextmanager
def _loss_function(fn: Callable[..., Any]) -> Iterator[None]:
    original = megatron_stack.per_token_loss
    megatron_stack.per_token_loss = fn
    try:
        yield
    finally:
        megatron_stack.per_token_loss = original


def _mean_over_own_tokens(
    labels: torch.Tensor, logits: torch.Tensor, step_tokens: int, micro_batches: int
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A micro-batch's loss as the mean over its own tokens (the schedule then averages those)."""
    own = int((labels[..., 1:] != megatron_stack.IGNORE_INDEX).sum())
    loss, _ = _PER_TOKEN_LOSS(labels, logits, own, 1)
    return loss, {"loss": loss.detach().clone()}


def mean_of_micro_batch_means(stack: Any) -> None:
    original = stack.train_step

    def train_step(*args: Any, **kwargs: Any) -> Any:
        with _loss_function(_mean_over_own_tokens):
            return original(*args, **kwargs)

    stack.train_step = train_step


def _params(stack: Any) -> list[torch.nn.Parameter]:
    return [p for chunk in stack.chunks for p in chunk.parameters() if p.requires_grad]


def _then(first: Callable[[], None], caller: Callable[[], Any] | None) -> Callable[[], None]:
    """``first``, then the caller's own ``grads_ready``, if any."""

    def ready() -> None:
        first()
        if caller is not None:
            caller()

    return ready


def clip_before_accumulation(stack: Any) -> None:
    """Each micro-batch's part of the main grads clipped by its own norm to the side's
    threshold as it is accumulated (measured at the next micro-batch's forward and when the
    grads are ready); the optimizer's clipping after accumulation off."""
    threshold = stack.optimizer.config.clip_grad
    for megatron_optimizer in _inner(stack):
        megatron_optimizer.config.clip_grad = 0.0
    params, original = _params(stack), stack.train_step
    start: list[torch.Tensor] = []

    def clip_last_part() -> None:
        if not start:
            start.extend(p.main_grad.detach().clone() for p in params)
            return
        parts = [p.main_grad - s for p, s in zip(params, start, strict=True)]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(d) for d in parts])))
        coef = threshold / (norm + 1e-6)
        for p, s, part in zip(params, start, parts, strict=True):
            if coef < 1.0:
                p.main_grad.copy_(s + part * coef)
            s.copy_(p.main_grad)

    def train_step(step: int, micro_batches: Any, forward: Any, **kwargs: Any) -> Any:
        start.clear()

        def clipped_forward(model: Any, batch: Any) -> Any:
            clip_last_part()
            return forward(model, batch)

        ready = _then(clip_last_part, kwargs.pop("grads_ready", None))
        return original(step, micro_batches, clipped_forward, grads_ready=ready, **kwargs)

    stack.train_step = train_step


def bf16_grad_buffer(stack: Any) -> None:
    """Each parameter's ``main_grad`` a bf16 tensor while the step's micro-batches accumulate
    into it (megatron-core's DDP hook adds each grad to it), copied into the fp32 buffer when
    the grads are ready."""
    params, original = _params(stack), stack.train_step

    def train_step(*args: Any, **kwargs: Any) -> Any:
        buffers = {p: p.main_grad for p in params}
        for p in params:
            p.main_grad = torch.zeros_like(buffers[p], dtype=torch.bfloat16)

        def to_fp32() -> None:
            for p in params:
                buffers[p].copy_(p.main_grad)
                p.main_grad = buffers[p]

        return original(*args, grads_ready=_then(to_fp32, kwargs.pop("grads_ready", None)), **kwargs)

    stack.train_step = train_step


def sdpa_attention(model: Any) -> list[Any]:
    """Every ``DotProductAttention`` of ``model`` computed by torch's SDPA (same scale, same
    causal mask, grouped heads repeated as megatron-core repeats them). Returns undo handles."""
    handles = []
    for module in model.modules():
        if type(module).__name__ == "DotProductAttention":
            module.forward = _sdpa_forward(module)
            handles.append(_Undo(module))
    return handles


class _Undo:
    def __init__(self, module: Any) -> None:
        self.module = module

    def remove(self) -> None:
        del self.module.forward


def _sdpa_forward(module: Any) -> Callable[..., torch.Tensor]:
    def forward(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None,
    ) -> torch.Tensor:  # fmt: skip
        sq, b, heads, _ = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
        mask = None if attention_mask is None else ~attention_mask  # megatron: True = masked
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=module.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(sq, b, -1)

    return forward
