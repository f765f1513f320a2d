"""The ``megatron`` trainer: a side trained by megatron-core's own stack: its
``DistributedDataParallel`` (grad buffers, ``main_grad``), ``get_megatron_optimizer``
(``FP32Optimizer``; ``Float16OptimizerWithFloat16Params`` with fp32 main params for bf16),
``OptimizerParamScheduler``, ``finalize_model_grads`` and the pipeline schedule, stepped by
``megatron_step.megatron_train_step``. No optimizer or scheduler of ours: the case's
``OptimizerSpec`` (``steps/spec.py``'s semantics) is translated into megatron-core's own
arguments, and that translation is written into the side's manifest (``TrainingSettings``):

- ``OptimizerConfig``: ``optimizer`` ``adam`` (``decoupled_weight_decay`` True for adamw,
  False for adam) or ``sgd`` (``sgd_momentum``); ``lr``; ``min_lr`` (the schedule's; the LR
  when there is none: every group's ``min_lr`` comes from here, the scheduler's own
  ``min_lr`` argument is overridden by it); ``weight_decay``; ``adam_beta1/2``, ``adam_eps``;
  ``clip_grad`` (0.0 = off: its default is 1.0); ``bf16`` and ``params_dtype`` from the model
  (fp32 main params, ``main_params_dtype``); ``log_num_zeros_in_grad`` (the zero count is
  Megatron's own).
- ``OptimizerParamScheduler``: counts samples, as Megatron-LM's training loop does:
  ``scheduler.step(increment=global batch)`` after each successful update,
  ``lr_warmup_steps = warmup_steps x global batch``, ``lr_decay_steps = decay_steps (None:
  steps) x global batch`` (counting the warmup, as the spec's ``decay_steps`` does),
  ``init_lr`` 0 (the first update of a warmup has LR 0), ``lr_decay_style`` the spec's decay,
  ``start_wd = end_wd = weight_decay`` (``wd_incr_style`` constant). Built even for a constant
  LR: a group's ``wd_mult`` (0 for the no-decay group) is applied only by the scheduler.
- ``no_decay``: None is Megatron's default groups (``wd_mult`` 0 for ``*.bias`` and 1-d
  parameters, the spec's default); globs become ``config_overrides`` ``{ParamKey(name=
  "module." + glob): wd_mult 0}`` (Megatron matches the DDP chunk's names, ``module.`` first;
  ``module.module.`` for a bf16 model, inside ``Float16Module`` as Megatron-LM wraps it);
  on a pipeline stage the globs are read in the model's global names (``*.layers.1.*`` is the
  second layer of the model, whatever its local index) and the key lists the matched names.
- ``DistributedDataParallelConfig(grad_reduce_in_fp32=True)`` (Megatron-LM's choice for
  bf16), no overlap; the model's ``TransformerConfig`` gets ``finalize_model_grads_func`` and
  ``no_sync_func``, as Megatron-LM's training loop sets them, and ``calculate_per_token_loss``
  False: the loss function gives the step's per-token loss itself (``per_token_loss``).

The manifest's ``plan`` (LR per step per group) is computed by megatron-core's own
``OptimizerParamScheduler`` run on copies of the real optimizer's param groups, never by a
formula of ours.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

from ..errors import CaseError
from ..steps.spec import OptimizerSpec, megatron_schedule_problem
from ..trace.step_scalars import StepScalars
from ..trace.training_record import TrainingPlan, TrainingSettings
from .megatron_cpu_patch import megatron_cpu
from .megatron_dp import replica_grad_scale
from .megatron_step import megatron_train_step

IGNORE_INDEX = -100
Forward = Callable[[torch.nn.Module, Mapping[str, Any]], torch.Tensor]  # (chunk, micro-batch) -> logits


@dataclass(frozen=True)
class MegatronArguments:
    """megatron-core's own arguments for one side (see the module doc)."""

    optimizer: dict[str, Any]  # OptimizerConfig(**optimizer), dtypes as names
    scheduler: dict[str, Any]  # OptimizerParamScheduler(optimizer, **scheduler)
    increment: int  # scheduler.step(increment=...) after each successful update
    no_decay: tuple[str, ...] | None  # config_overrides' ParamKey names (None: Megatron's default)
    ddp: dict[str, Any] = field(default_factory=lambda: {"grad_reduce_in_fp32": True})
    recompute: str | None = None  # the model's TransformerConfig.recompute_granularity

    def as_json(self) -> dict[str, Any]:
        overrides = None
        if self.no_decay is not None:
            overrides = [{"ParamKey": {"name": list(self.no_decay)}, "ParamGroupOverride": {"wd_mult": 0.0}}]
        return {
            "OptimizerConfig": dict(self.optimizer),
            "OptimizerParamScheduler": dict(self.scheduler),
            "scheduler_increment": self.increment,
            "config_overrides": overrides,
            "DistributedDataParallelConfig": dict(self.ddp),
            "TransformerConfig": {"calculate_per_token_loss": False, "recompute_granularity": self.recompute},
            "wrappers": ["DistributedDataParallel", "Float16Module"]
            if self.optimizer["bf16"]
            else ["DistributedDataParallel"],
            "loss_func": "sum of token losses / step tokens x micro-batches (the schedule divides by them)",
        }


def megatron_arguments(
    spec: OptimizerSpec,
    steps: int,
    global_batch: int,
    dtype: str,
    data_parallel: int = 1,
    recompute: str | None = None,
) -> MegatronArguments:
    """The case's optimizer spec as megatron-core's arguments (``dtype``: the model's params
    dtype name, ``float32`` or ``bfloat16``; ``data_parallel`` > 1: the distributed optimizer;
    ``recompute``: the model's ``recompute_granularity``, kept for the plan)."""
    schedule = spec.schedule
    warmup = schedule.warmup_steps if schedule is not None else 0
    decay = schedule.decay if schedule is not None else "constant"
    horizon = (schedule.decay_steps if schedule is not None else None) or steps
    min_lr = schedule.min_lr if schedule is not None and schedule.decay != "constant" else spec.lr
    problem = megatron_schedule_problem(schedule, steps)  # the config refuses it first
    if problem is not None:
        raise CaseError(problem)
    if warmup >= horizon:
        horizon = warmup + 1  # unused by a constant LR; the scheduler asserts warmup < decay
    optimizer: dict[str, Any] = {
        "optimizer": "sgd" if spec.name == "sgd" else "adam",
        "lr": spec.lr,
        "min_lr": min_lr,
        "weight_decay": spec.weight_decay,
        "clip_grad": spec.clip_grad if spec.clip_grad is not None else 0.0,
        "bf16": dtype == "bfloat16",
        "params_dtype": dtype,
        "main_params_dtype": "float32",
        "log_num_zeros_in_grad": True,
    }
    if spec.name == "sgd":
        optimizer["sgd_momentum"] = spec.momentum
    else:
        optimizer |= {
            "adam_beta1": spec.betas[0],
            "adam_beta2": spec.betas[1],
            "adam_eps": spec.eps,
            "decoupled_weight_decay": spec.name == "adamw",
        }
    scheduler = {
        "init_lr": 0.0,
        "max_lr": spec.lr,
        "min_lr": min_lr,
        "lr_warmup_steps": warmup * global_batch,
        "lr_decay_steps": horizon * global_batch,
        "lr_decay_style": decay,
        "start_wd": spec.weight_decay,
        "end_wd": spec.weight_decay,
        **{"wd_incr_steps": horizon * global_batch, "wd_incr_style": "constant"},
    }
    prefix = "module.module." if dtype == "bfloat16" else "module."  # DDP(Float16Module(model))
    no_decay = None if spec.no_decay is None else tuple(prefix + glob for glob in spec.no_decay)
    ddp: dict[str, Any] = {"grad_reduce_in_fp32": True}
    if data_parallel > 1:  # DistributedOptimizer: grads reduce-scattered, params all-gathered
        optimizer["use_distributed_optimizer"] = ddp["use_distributed_optimizer"] = True
    return MegatronArguments(optimizer, scheduler, global_batch, no_decay, ddp, recompute)


def _megatron() -> dict[str, Any]:
    """megatron-core's training classes and functions by name (imported on first use)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import distributed, optimizer, optimizer_param_scheduler
        from megatron.core.optimizer import optimizer_config
        from megatron.core.transformer.module import Float16Module
    return {
        "Float16Module": Float16Module,
        "DistributedDataParallel": distributed.DistributedDataParallel,
        "DistributedDataParallelConfig": distributed.DistributedDataParallelConfig,
        "finalize_model_grads": distributed.finalize_model_grads,
        "OptimizerConfig": optimizer.OptimizerConfig,
        "get_megatron_optimizer": optimizer.get_megatron_optimizer,
        "ParamKey": optimizer_config.ParamKey,
        "OptimizerParamScheduler": optimizer_param_scheduler.OptimizerParamScheduler,
    }


def _optimizer_config(args: MegatronArguments, mc: dict[str, Any]) -> Any:
    options = dict(args.optimizer)
    for key in ("params_dtype", "main_params_dtype"):
        options[key] = getattr(torch, options[key])
    return mc["OptimizerConfig"](**options)


def per_token_loss(
    labels: torch.Tensor, logits: torch.Tensor, step_tokens: int, micro_batches: int
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A micro-batch's part of the step's per-token loss, for megatron-core's schedule: the
    next-token cross-entropy summed over its tokens and divided by the step's tokens (as
    transformers does with ``num_items_in_batch``), times ``micro_batches``, which the
    schedule divides its loss by (its averaging over micro-batches); and
    ``{"loss": [sum, tokens]}`` for the step's reported loss. So the backward of every layer
    carries the grads of the step's per-token loss, as on the other frameworks. (megatron-core's
    ``calculate_per_token_loss`` would instead divide the summed grads by the tokens in
    ``finalize_model_grads``: the same update, but each layer's grads during the backward the
    step's token count times larger.) Labels -100 are not tokens; float32 as elsewhere."""
    shift_logits = logits[..., :-1, :].float().reshape(-1, logits.shape[-1])
    shift_labels = labels[..., 1:].reshape(-1).to(shift_logits.device)
    total = torch.nn.functional.cross_entropy(
        shift_logits, shift_labels, ignore_index=IGNORE_INDEX, reduction="sum"
    )
    tokens = (shift_labels != IGNORE_INDEX).sum()
    part = total / max(1, step_tokens)
    reported = {"loss": torch.stack([total.detach().clone(), tokens.detach().float()])}
    return part * micro_batches if micro_batches > 1 else part, reported


@dataclass
class MegatronStack:
    """A side's megatron-core stack, built by ``build_megatron_stack``."""

    chunks: list[Any]  # DistributedDataParallel, one per model chunk
    optimizer: Any
    scheduler: Any
    arguments: MegatronArguments
    group_names: list[list[str]]  # parameter names of each optimizer group (the side's names)

    def plan(self, steps: int) -> TrainingPlan:
        """The LR of each group at each update and each group's weight decay, as megatron-core's
        OptimizerParamScheduler sets them (``megatron_plan`` over the optimizer's groups)."""
        return megatron_plan(self.optimizer.param_groups, self.group_names, self.arguments, steps)

    def recorded_params(self) -> str:
        """Which copy of the parameters a step's records hold (``HookRecorder.record_params``)."""
        if self.arguments.optimizer["bf16"]:
            return "main_param (the float32 main params Float16OptimizerWithFloat16Params steps)"
        return "model params (float32, stepped by FP32Optimizer)"

    def training_manifest(self, steps: int, micro_batches: int) -> TrainingSettings:
        """The settings (manifest's ``"training"`` block) of this side."""
        block = training_block(self.arguments, self.plan(steps), micro_batches)
        inner = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        classes = [type(self.optimizer).__name__] + [
            type(o).__name__ for o in inner if o is not self.optimizer
        ]
        # known once the stack is built (not in the plan made before training)
        built = {"recorded_params": self.recorded_params(), "optimizer_class": classes}
        return replace(block, arguments={**block.arguments, **built})

    def train_step(
        self,
        step: int,
        micro_batches: Sequence[Mapping[str, Any]],
        forward: Forward,
        *,
        on_output: Callable[[str, torch.Tensor], Any] | None = None,
        grads_ready: Callable[[], Any] | None = None,
        step_batches: Sequence[Mapping[str, Any]] | None = None,
        data_parallel: int = 1,
    ) -> tuple[list[dict[str, Any]], StepScalars]:
        """One update over ``micro_batches`` (each ``{"input_ids", "labels", ...}``, HF-style
        unshifted labels) through the pipeline schedule; ``forward(chunk, batch)`` returns
        the chunk's output (the logits on the last stage). ``on_output(kind, tensor)`` sees
        each micro-batch's ``logits`` and ``loss`` (its token losses over the step's tokens,
        what it adds to the step's loss) on the last stage; ``grads_ready``: see
        ``megatron_train_step``. With ``data_parallel`` replicas, ``micro_batches`` is this
        replica's share of ``step_batches`` (all the step's): the loss is per token over the
        whole step, and the parameter grads are times the replicas (``replica_grad_scale``:
        DDP averages the replicas' grads)."""
        if not micro_batches:
            raise CaseError(f"step {step}: no micro-batches to train on")
        ids = micro_batches[0]["input_ids"]
        every = micro_batches if step_batches is None else step_batches
        step_tokens = sum(int((b["labels"][..., 1:] != IGNORE_INDEX).sum()) for b in every)

        count = len(micro_batches)

        def loss_func(labels: torch.Tensor, logits: torch.Tensor) -> Any:
            loss, reported = per_token_loss(labels, logits, step_tokens, count)
            if on_output is not None:
                on_output("logits", logits)
                on_output("loss", loss / count if count > 1 else loss)  # its part of the step's loss
            return loss, reported

        def forward_step(data_iterator: Any, model: Any) -> Any:
            batch = next(data_iterator)
            return forward(model, batch), partial(loss_func, batch["labels"])

        iterators = [iter(micro_batches) for _ in self.chunks]
        with replica_grad_scale(self.chunks, data_parallel):
            return megatron_train_step(
                step=step,
                forward_step_func=forward_step,
                data_iterator=iterators if len(iterators) > 1 else iterators[0],
                model=self.chunks,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                num_microbatches=len(micro_batches),
                seq_length=int(ids.shape[-1]),
                micro_batch_size=int(ids.shape[0]),
                increment=self.arguments.increment,
                batches=every,
                grads_ready=grads_ready,
            )


def megatron_plan(
    groups: Sequence[Mapping[str, Any]],
    group_names: list[list[str]],
    arguments: MegatronArguments,
    steps: int,
) -> TrainingPlan:
    """The plan of a side trained by megatron-core's stack: each group's LR at each update and
    its weight decay, as megatron-core's own OptimizerParamScheduler sets them, run on copies
    of ``groups`` (the optimizer's, or ``_get_param_groups``' before training: the optimizer's
    groups are made from them)."""
    mc = _megatron()
    holder = _GroupsCopy(groups)
    scheduler = mc["OptimizerParamScheduler"](holder, **arguments.scheduler)
    lrs: list[list[float]] = []
    decays: list[float] = [float(g["weight_decay"]) for g in holder.param_groups]
    for _ in range(steps):
        lrs.append([float(g["lr"]) for g in holder.param_groups])
        scheduler.step(increment=arguments.increment)
    opt = arguments.optimizer
    adam = opt["optimizer"] == "adam"
    return TrainingPlan(
        optimizer=("adamw" if opt.get("decoupled_weight_decay") else "adam")
        if adam
        else str(opt["optimizer"]),
        lr=tuple(tuple(step) for step in lrs),
        weight_decay=tuple(decays),
        groups=tuple(tuple(names) for names in group_names),
        betas=(float(opt["adam_beta1"]), float(opt["adam_beta2"])) if adam else None,
        eps=float(opt["adam_eps"]) if adam else None,
        momentum=float(opt["sgd_momentum"]) if opt["optimizer"] == "sgd" else None,
        clip_grad=float(opt["clip_grad"]) if opt["clip_grad"] else None,  # 0.0: off
        micro_batches=None,  # set by the caller, who splits the batches (training_block)
        loss_normalisation="per_token_over_step",
        precision=str(opt["params_dtype"]),  # bf16 params: the forward computes in bf16
        autocast=False,
        gradient_checkpointing=arguments.recompute is not None,
    )


def training_block(arguments: MegatronArguments, plan: TrainingPlan, micro_batches: int) -> TrainingSettings:
    """The settings (manifest's ``"training"`` block) of a megatron side."""
    from importlib.metadata import version

    return TrainingSettings(
        "megatron",
        "megatron-core",
        version("megatron-core"),
        arguments.as_json(),
        replace(plan, micro_batches=micro_batches),
    )


class _Chunk(torch.nn.Module):
    """A model chunk under the name DDP gives it (``module.``), for megatron-core's
    ``_get_param_groups`` before the stack is built (DDP is not: it would hook the grads)."""

    def __init__(self, chunk: torch.nn.Module) -> None:
        super().__init__()
        self.module = chunk


def plan_before_training(
    chunks: Sequence[torch.nn.Module],
    spec: OptimizerSpec,
    steps: int,
    global_batch: int,
    micro_batches: int,
    names: Callable[[int, str], str] | None = None,
    data_parallel: int = 1,
) -> TrainingSettings:
    """The settings ``build_megatron_stack(...).training_manifest`` will write
    (but the keys known once the stack is built: ``recorded_params``, ``optimizer_class``),
    without building the stack: the groups from megatron-core's own ``_get_param_groups``
    (which ``get_megatron_optimizer`` makes the optimizer's from) over ``chunks`` as DDP names
    them (``module.``, ``module.module.`` for a bf16 model in ``Float16Module``), the same
    config overrides, and ``megatron_plan``."""
    mc = _megatron()
    config: Any = getattr(chunks[0], "config")  # noqa: B009  # megatron's TransformerConfig
    dtype = str(config.params_dtype).removeprefix("torch.")
    args = megatron_arguments(
        spec, steps, global_batch, dtype, data_parallel, getattr(config, "recompute_granularity", None)
    )
    overrides = None
    if args.no_decay is not None:
        overrides = {mc["ParamKey"](name=_no_decay_names(chunks, args.no_decay, names)): {"wd_mult": 0.0}}
    wrap = (lambda c: _Chunk(_Chunk(c))) if config.bf16 else _Chunk
    with megatron_cpu(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.optimizer import _get_param_groups

        groups = _get_param_groups([wrap(c) for c in chunks], _optimizer_config(args, mc), overrides)
    plan = megatron_plan(groups, _group_names(chunks, groups, names), args, steps)
    return training_block(args, plan, micro_batches)


class _GroupsCopy:
    """What OptimizerParamScheduler reads and writes of an optimizer (its ``param_groups``),
    as copies without the parameters: the plan leaves the real optimizer untouched."""

    def __init__(self, groups: Sequence[Mapping[str, Any]]) -> None:
        self.param_groups = [{k: v for k, v in g.items() if k != "params"} for g in groups]


def build_megatron_stack(
    chunks: Sequence[torch.nn.Module],
    spec: OptimizerSpec,
    steps: int,
    global_batch: int,
    names: Callable[[int, str], str] | None = None,
    data_parallel: int = 1,
) -> MegatronStack:
    """Wrap ``chunks`` (megatron-core modules, one per virtual pipeline stage) in Megatron's DDP
    and build its optimizer and scheduler from ``spec`` (``names(chunk index, local name)``:
    the side's name of a parameter, for the plan's groups; default: the local name;
    ``data_parallel`` > 1: the distributed optimizer)."""
    mc = _megatron()
    config: Any = getattr(chunks[0], "config")  # noqa: B009  # megatron's TransformerConfig
    dtype = str(config.params_dtype).removeprefix("torch.")
    args = megatron_arguments(
        spec, steps, global_batch, dtype, data_parallel, getattr(config, "recompute_granularity", None)
    )
    ddp_config = mc["DistributedDataParallelConfig"](**args.ddp)
    # Read when DDP is built (its grad scaling factor) and by every schedule run.
    config.calculate_per_token_loss = False  # the loss function normalises per token over the step
    config.finalize_model_grads_func = mc["finalize_model_grads"]
    with megatron_cpu(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = [  # Megatron-LM's get_model: a bf16 model inside Float16Module, then DDP
            mc["DistributedDataParallel"](
                config,
                ddp_config,
                mc["Float16Module"](config, chunk) if config.bf16 else chunk,
                disable_bucketing=index > 0,
            )
            for index, chunk in enumerate(chunks)
        ]
        config.no_sync_func = [c.no_sync for c in wrapped] if len(wrapped) > 1 else wrapped[0].no_sync
        overrides = None
        if args.no_decay is not None:
            overrides = {mc["ParamKey"](name=_no_decay_names(chunks, args.no_decay, names)): {"wd_mult": 0.0}}
        optimizer = mc["get_megatron_optimizer"](
            _optimizer_config(args, mc), wrapped, config_overrides=overrides
        )
        scheduler = mc["OptimizerParamScheduler"](optimizer, **args.scheduler)
    return MegatronStack(
        wrapped, optimizer, scheduler, args, _group_names(chunks, optimizer.param_groups, names)
    )


def _no_decay_names(
    chunks: Sequence[torch.nn.Module], globs: tuple[str, ...], names: Callable[[int, str], str] | None
) -> tuple[str, ...]:
    """The ``ParamKey`` names of the no-decay group: the globs themselves in one process; with
    ``names`` (a pipeline stage, whose local layer numbering starts at 0) the globs are read in
    the side's global names and become the DDP names of the local parameters they match."""
    if names is None:
        return globs
    bf16 = getattr(getattr(chunks[0], "config", None), "bf16", False)
    prefix = "module.module." if bf16 else "module."  # as megatron_arguments prefixed the globs
    return tuple(
        f"{prefix}{local}"
        for index, chunk in enumerate(chunks)
        for local, _ in chunk.named_parameters()
        if any(fnmatch.fnmatchcase(f"{prefix}{names(index, local)}", glob) for glob in globs)
    )


def _group_names(
    chunks: Sequence[torch.nn.Module],
    groups: Sequence[Mapping[str, Any]],
    names: Callable[[int, str], str] | None,
) -> list[list[str]]:
    """The names of each optimizer group's parameters (an fp32 main param by its model param's)."""
    by_id: dict[int, str] = {}
    for index, chunk in enumerate(chunks):
        for local, param in chunk.named_parameters():
            name = (
                names(index, local)
                if names is not None
                else (local if len(chunks) == 1 else f"chunk{index}.{local}")
            )
            by_id[id(param)] = name
            main = getattr(param, "main_param", None)
            if main is not None:
                by_id[id(main)] = name
    return [[by_id[id(p)] for p in group["params"] if id(p) in by_id] for group in groups]
