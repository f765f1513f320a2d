"""Training faults planted in a candidate through its model's ``patch:`` (align.yaml's
faulty cases). The first three change what the side's optimizer or scheduler classes do over
this model's parameters: the side's plan (made by its own trainer's optimizer and scheduler
over its parameters, before anything trains) shows them, so the contract check stops those
cases before step 0. The layer bugs are found in the run. The two Lightning faults make a
``training: lightning`` side behave as a plain user's Lightning: AdamW built with torch's
defaults (weight decay 0.01), the loss a mean of micro-batch means; each shows in that side's
plan. Only this model's optimizer, scheduler, layer or LightningModule change."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

WARMUP, STEPS = 2, 10  # the cases' schedule: warmup 2, cosine decay over 10 updates


def _owner(model: torch.nn.Module) -> Callable[[Any], bool]:
    owned = {id(p): weakref.ref(p) for p in model.parameters()}

    def owns(optimizer: Any) -> bool:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        return any((ref := owned.get(id(p))) is not None and ref() is p for p in params)

    return owns


def _wrap_lambda(model: torch.nn.Module, step_of: Callable[[int], float]) -> None:
    """The LambdaLR over this model's optimizer evaluates its lambda at ``step_of(step)``."""
    owns, original = _owner(model), torch.optim.lr_scheduler.LambdaLR.__init__

    def init(self: Any, optimizer: Any, lr_lambda: Any, *args: Any, **kwargs: Any) -> None:
        if owns(optimizer):
            inner = lr_lambda

            def lr_lambda(s: int) -> float:
                whole = step_of(s)
                low = math.floor(whole)
                if whole == low:
                    return float(inner(int(whole)))
                return float(inner(low) + (whole - low) * (inner(low + 1) - inner(low)))

        original(self, optimizer, lr_lambda, *args, **kwargs)

    torch.optim.lr_scheduler.LambdaLR.__init__ = init  # type: ignore[method-assign]


def warmup_one_step_behind(model: torch.nn.Module) -> None:
    """The scheduler is stepped once too late: update s uses the LR of update s - 1."""
    _wrap_lambda(model, lambda s: max(s - 1, 0))


def decay_horizon_shortened(model: torch.nn.Module) -> None:
    """The decay horizon counts the warmup twice: the cosine reaches its floor at update
    STEPS - WARMUP instead of STEPS (as in AReaL PR #1289)."""
    short = STEPS - WARMUP
    _wrap_lambda(
        model,
        lambda s: (
            s if s <= WARMUP else min(STEPS, WARMUP + (s - WARMUP) * (STEPS - WARMUP) / (short - WARMUP))
        ),
    )


Groups = list[dict[str, Any]]


def _wrap_adamw(
    model: torch.nn.Module, change: Callable[[Groups, dict[str, Any]], tuple[Groups, dict[str, Any]]]
) -> None:
    """An AdamW built over this model's parameter groups is built from ``change(groups, kwargs)``."""
    owned = {id(p): weakref.ref(p) for p in model.parameters()}  # ids are reused once it is freed
    original = torch.optim.AdamW.__init__

    def init(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        params = list(params)
        groups = [g for g in params if isinstance(g, dict)]
        if any((ref := owned.get(id(p))) is not None and ref() is p for g in groups for p in g["params"]):
            params, kwargs = change(groups, kwargs)
        original(self, params, *args, **kwargs)

    torch.optim.AdamW.__init__ = init  # type: ignore[method-assign]


def weight_decay_on_norms(model: torch.nn.Module) -> None:
    """Every parameter group of this model's AdamW gets the weight decay, norms and biases too."""

    def change(groups: Groups, kwargs: dict[str, Any]) -> tuple[Groups, dict[str, Any]]:
        decay = max(float(g.get("weight_decay", 0.0)) for g in groups)
        return [{**g, "weight_decay": decay} for g in groups], kwargs

    _wrap_adamw(model, change)


def layer1_mlp_from_step_5(model: torch.nn.Module) -> None:
    """model.layers.1.mlp scales its output by 1.01 from update 5 on (2 micro-batches a step:
    from its 11th call)."""
    mlp, calls = model.get_submodule("model.layers.1.mlp"), [0]
    forward = mlp.forward

    def late(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        out = forward(x)
        return out * 1.01 if calls[0] > 10 else out

    mlp.forward = late


def layer1_mlp_scaled(model: torch.nn.Module) -> None:
    """model.layers.1.mlp scales its output by 1.01 from the first call on: a 1 % fault, below
    what 10 bf16 AdamW steps let two correct runs drift apart, caught where it starts."""
    mlp = model.get_submodule("model.layers.1.mlp")
    forward = mlp.forward

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return forward(x) * 1.01

    mlp.forward = scaled


def dp_grads_summed(model: torch.nn.Module) -> None:
    """megatron-core's DDP over this model's parameters skips its data-parallel grad scaling
    (``gradient_scaling_factor`` 1/DP): the replicas' grads are summed, not averaged."""
    from megatron.core.distributed import param_and_grad_buffer as buffers

    owned = {id(p): weakref.ref(p) for p in model.parameters()}
    original = buffers._ParamAndGradBuffer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if any((ref := owned.get(id(p))) is not None and ref() is p for p in self.params):
            for bucket in self.buckets:
                bucket.gradient_scaling_factor = 1.0

    buffers._ParamAndGradBuffer.__init__ = init  # type: ignore[method-assign]


def torch_adamw_defaults(model: torch.nn.Module) -> None:
    """The AdamW over this model's parameters built with torch's defaults, as a plain user's
    Lightning ``configure_optimizers`` writes it (``torch.optim.AdamW(params, lr=...)``): the
    weight decay it was given is dropped, so torch's default 0.01 applies to every group."""

    def change(groups: Groups, kwargs: dict[str, Any]) -> tuple[Groups, dict[str, Any]]:
        kept = {k: v for k, v in kwargs.items() if k != "weight_decay"}
        return [{k: v for k, v in g.items() if k != "weight_decay"} for g in groups], kept

    _wrap_adamw(model, change)


def lightning_mean_of_micro_batch_means(model: torch.nn.Module) -> None:
    """The ``training: lightning`` side's LightningModule around this model returns each
    micro-batch's mean loss, as a plain user's ``training_step`` does
    (``return model(**batch).loss``): Lightning divides it by ``accumulate_grad_batches``, so
    the step trains on the mean of its micro-batch means, not on the loss per token over the
    step (they differ when the micro-batches hold different numbers of tokens)."""
    from pytest_precalign.run.trainers.lightning import MEAN_OF_MEANS, CaseModule

    original = CaseModule.__init__

    def init(self: Any, loaded: Any, *args: Any, **kwargs: Any) -> None:
        original(self, loaded, *args, **kwargs)
        if loaded.module is model:
            self.loss_normalisation = MEAN_OF_MEANS

    CaseModule.__init__ = init  # type: ignore[method-assign]
