"""The settings and plan of a user's own training run, as ``PrecalignCallback`` and the
``Recorder`` write them (``trace.training_record``: ``TrainingSettings``, ``TrainingPlan``).

The plan's LRs come from the run's OWN schedulers -- the objects that will step the run, a
user's custom one too, as a Trainer, a loop, Lightning or Accelerate steps them:
``planned_lrs`` reads every group's LR, steps the schedulers through the planned steps, and
puts everything back exactly (each scheduler's ``state_dict`` and every
scalar of every parameter group: ``lr``, ``initial_lr``, ``momentum``, ``betas`` ... that
OneCycleLR-style schedulers move), then checks the groups are bitwise what they were (a
``RecorderError`` if not, before the run takes a step). A ``ReduceLROnPlateau`` decides from
metrics the plan cannot know: no plan then (the arguments and adapters are still written).

Names are the ones the records use: the parameters of the model inside its wrappers
(``unwrap``: a PEFT model's ``base_model.model.<name>`` is ``<name>``), for the plan's groups,
``frozen`` (parameters with ``requires_grad`` False) and ``initial_params``.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from packaging.version import InvalidVersion, Version

from ..errors import ConfigError, RecorderError
from ..recording.module_names import clean
from ..trace.training_record import (
    LOSS_NORMALISATIONS,
    PRECISIONS,
    Adapter,
    TrainingPlan,
    TrainingSettings,
)
from .unwrap import unwrap

# TrainingArguments fields that say where and how a run reports, not what it trains.
RUN_LOCAL_ARGUMENTS = frozenset(
    {
        "output_dir",
        "logging_dir",
        "run_name",
        "report_to",
        "disable_tqdm",
        "hub_token",
        "hub_model_id",
        "push_to_hub",
        "overwrite_output_dir",
        "project",
        "trackio_space_id",
    }
)


def named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The model's parameters named as its records are: inside its wrappers (``unwrap``),
    without the wrappers' segments inside it (``module_names.clean``)."""
    inner, _ = unwrap(model)
    return [(clean(name), p) for name, p in inner.named_parameters()]


def frozen_parameters(model: torch.nn.Module) -> tuple[str, ...]:
    """The names of the parameters that do not train (``requires_grad`` False)."""
    return tuple(name for name, p in named_parameters(model) if not p.requires_grad)


def adapters_of(model: torch.nn.Module) -> tuple[Adapter, ...]:
    """Each PEFT adapter of the model (``peft_config[name]`` of the outermost module that has
    one), by name; none for a model without PEFT."""
    found = (getattr(m, "peft_config", None) for m in model.modules())
    configs: Mapping[str, Any] | None = next((c for c in found if isinstance(c, Mapping)), None)
    if configs is None:
        return ()
    out = []
    for name in sorted(configs):
        config = configs[name]
        kind = getattr(config, "peft_type", "")
        targets = getattr(config, "target_modules", None)
        if isinstance(targets, str):
            targets = (targets,)  # a regular expression, as given
        r, alpha, dropout = (getattr(config, k, None) for k in ("r", "lora_alpha", "lora_dropout"))
        out.append(
            Adapter(
                name=str(name),
                kind=str(kind.value if isinstance(kind, enum.Enum) else kind),
                r=int(r) if isinstance(r, int) else None,
                alpha=float(alpha) if isinstance(alpha, (int, float)) else None,
                dropout=float(dropout) if isinstance(dropout, (int, float)) else None,
                target_modules=tuple(sorted(str(t) for t in targets or ())),
            )
        )
    return tuple(out)


def attn_implementation(model: torch.nn.Module) -> str | None:
    """The attention implementation the model's config selects (Hugging Face models)."""
    inner, _ = unwrap(model)
    value = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    return value if isinstance(value, str) else None


def json_safe(value: Any) -> Any:
    """``value`` as JSON: mappings and sequences kept, enums by value, a non-finite float or
    any other object by its text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [json_safe(v) for v in items]
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return str(value)


# -- the plan -----------------------------------------------------------------------------------


def _torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (and the like)."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def _group_scalars(groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every group's settings but its parameters: the objects, and a copy of each tensor's value."""
    return [
        {
            k: (v, v.detach().clone() if isinstance(v, torch.Tensor) else None)
            for k, v in g.items()
            if k != "params"
        }
        for g in groups
    ]


def _restore_groups(groups: Sequence[dict[str, Any]], saved: Sequence[dict[str, Any]]) -> None:
    for group, before in zip(groups, saved, strict=True):
        for key in [k for k in group if k != "params" and k not in before]:
            del group[key]
        for key, (obj, copy) in before.items():
            if copy is not None:
                with torch.no_grad():
                    obj.copy_(copy)  # the same tensor object, its value put back in place
            group[key] = obj


def _same_groups(groups: Sequence[dict[str, Any]], saved: Sequence[dict[str, Any]]) -> bool:
    for group, before in zip(groups, saved, strict=True):
        if set(group) - {"params"} != set(before):
            return False
        for key, (obj, copy) in before.items():
            if group[key] is not obj:
                return False
            if copy is not None and not torch.equal(obj, copy):
                return False
    return True


_WITHOUT = "record without a plan: PrecalignCallback(..., plan=False), or no Recorder.record_settings"


def planned_lrs(
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    steps: int,
    advance: Callable[[int], None] | None = None,
    *,
    without: str = _WITHOUT,
) -> tuple[tuple[float, ...], ...] | None:
    """Every group's LR (the groups of ``optimizers`` in order) at each of the next ``steps``
    optimizer steps, from the run's own ``schedulers`` (none: the LRs stay as they are), left
    exactly as they were (see the module doc). ``advance(s)`` does what the run does to its
    schedulers after update ``s`` (default: ``step()`` each). None when a scheduler decides from
    metrics (``ReduceLROnPlateau``) or cannot be put back (no ``state_dict``). A scheduler that
    raises or is not put back exactly: a ``RecorderError`` ending with ``without`` (how to record
    without a plan)."""
    groups = [g for optimizer in optimizers for g in _torch_optimizer(optimizer).param_groups]
    if not schedulers:
        return tuple(tuple(float(g["lr"]) for g in groups) for _ in range(steps))
    if any(
        isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau)
        or not callable(getattr(s, "state_dict", None))
        for s in schedulers
    ):
        return None
    name = "+".join(type(s).__name__ for s in schedulers)
    try:
        states = [_copied(s.state_dict()) for s in schedulers]
    except Exception as exc:  # a state that cannot be copied cannot be put back: not stepped
        raise RecorderError(f"the LR plan: {name}'s state_dict cannot be copied ({exc}); {without}") from None
    saved = _group_scalars(groups)

    def step_each(_: int) -> None:
        for scheduler in schedulers:
            scheduler.step()

    lrs: list[tuple[float, ...]] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": on purpose
            for step in range(steps):
                lrs.append(tuple(float(g["lr"]) for g in groups))
                if step + 1 < steps:  # the LR after the last planned step is not needed
                    (advance or step_each)(step)
    except Exception as exc:
        raise RecorderError(
            f"the LR plan: {name}.step() raised at planned step {len(lrs)} ({exc}); {without}"
        ) from None
    finally:
        for scheduler, state in zip(schedulers, states, strict=True):
            scheduler.load_state_dict(_copied(state))
        _restore_groups(groups, saved)
    if not _same_groups(groups, saved) or not all(
        _same_state(s.state_dict(), state) for s, state in zip(schedulers, states, strict=True)
    ):
        raise RecorderError(f"the LR plan: {name} could not be put back exactly after reading it; {without}")
    return tuple(lrs)


def _copied(state: Mapping[str, Any]) -> dict[str, Any]:
    import copy

    return copy.deepcopy(dict(state))


def _same_state(a: Any, b: Any) -> bool:
    """Two scheduler states equal value for value (tensors by ``torch.equal``)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b) or (a != a and b != b)  # NaN == NaN here
    except Exception:
        return a is b


def optimizer_settings(optimizer: Any) -> dict[str, Any]:
    """A torch optimizer's own settings for a plan: its name (the class's, in lower case),
    ``betas`` and ``eps`` (Adam, AdamW), ``momentum`` (SGD), as its first group holds them
    (its defaults where it has no group); None for a setting it does not have."""
    torch_optimizer = _torch_optimizer(optimizer)
    groups = torch_optimizer.param_groups
    first = groups[0] if groups else torch_optimizer.defaults
    betas, eps, momentum = first.get("betas"), first.get("eps"), first.get("momentum")
    return {
        "optimizer": type(torch_optimizer).__name__.lower(),
        "betas": None if betas is None else (float(betas[0]), float(betas[1])),
        "eps": None if eps is None else float(eps),
        "momentum": None if momentum is None else float(momentum),
    }


def gradient_checkpointing(model: torch.nn.Module) -> bool:
    """Whether the model recomputes activations in its backward (transformers'
    ``gradient_checkpointing_enable``: ``is_activation_checkpointing``, before v5
    ``is_gradient_checkpointing``; the older name warns in v5, so it is read only without the
    newer one)."""
    inner, _ = unwrap(model)
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(inner), name):
            return bool(getattr(inner, name))
    return False


def optimizer_plan(
    model: torch.nn.Module,
    optimizer: Any,
    lrs: Sequence[Sequence[float]],
    *,
    names: Mapping[int, str] | None = None,
    **settings: Any,
) -> TrainingPlan:
    """The plan of ``optimizer`` over ``model``'s parameters (named as the records are, or by
    ``names``: ``id(parameter)`` -> name) with the planned ``lrs``; ``settings``: the plan's
    other fields (clip_grad, micro_batches...)."""
    torch_optimizer = _torch_optimizer(optimizer)
    groups = torch_optimizer.param_groups
    if names is None:
        names = {id(p): name for name, p in named_parameters(model)}
    return TrainingPlan(
        lr=tuple(tuple(float(v) for v in step) for step in lrs),
        weight_decay=tuple(float(g.get("weight_decay", 0.0)) for g in groups),
        groups=tuple(
            tuple(names.get(id(p), f"<unnamed {i}.{j}>") for j, p in enumerate(g["params"]))
            for i, g in enumerate(groups)
        ),
        **optimizer_settings(torch_optimizer),
        **settings,
    )


def params_precision(params: Iterable[torch.Tensor]) -> str | None:
    """The dtype the forward computes in when nothing autocasts: its floating parameters'
    (the first one's; None: no floating parameter)."""
    dtype = next((p.dtype for p in params if p.is_floating_point()), None)
    return None if dtype is None else str(dtype).removeprefix("torch.")


def forward_precision(model: torch.nn.Module) -> str:
    """The dtype of the model's first floating parameter (what it computes in without autocast)."""
    return params_precision(model.parameters()) or "float32"


# -- a Trainer's run ----------------------------------------------------------------------------


def accepts_loss_kwargs(model: torch.nn.Module) -> bool:
    """Whether the Trainer passes ``num_items_in_batch`` to the model's forward (transformers'
    ``Trainer.__init__``: the model's ``accepts_loss_kwargs``, else a ``**kwargs`` forward)."""
    inner, _ = unwrap(model)
    known = getattr(inner, "accepts_loss_kwargs", None)
    if isinstance(known, bool):
        return known
    try:
        parameters = inspect.signature(inner.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)


def trainer_passes_num_items(model: torch.nn.Module, version: str) -> bool:
    """Whether transformers ``version``'s Trainer passes ``num_items_in_batch`` to the model
    (read from the release wheels' ``Trainer.__init__``): never before 4.46 (transformers PR
    #34191 brought it; 4.45's ``compute_loss`` calls ``model(**inputs)``); in 4.46.x only to a
    forward with a parameter named ``loss_kwargs``; from 4.47 as ``accepts_loss_kwargs`` says."""
    try:
        release = Version(version).release
    except InvalidVersion:
        return accepts_loss_kwargs(model)
    if release < (4, 46):
        return False
    if release < (4, 47):
        inner, _ = unwrap(model)
        try:
            return "loss_kwargs" in inspect.signature(inner.forward).parameters
        except (TypeError, ValueError):
            return False
    return accepts_loss_kwargs(model)


def trainer_arguments(args: Any, model: torch.nn.Module) -> dict[str, Any]:
    """The Trainer's own arguments (``TrainingArguments`` or a subclass such as TRL's
    ``SFTConfig``: its class and every field but the run-local ones) and the model's attention
    implementation."""
    fields = json_safe(args.to_dict()) if callable(getattr(args, "to_dict", None)) else {}
    if not isinstance(fields, dict):
        fields = {}
    cls = type(args)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "TrainingArguments": {k: v for k, v in fields.items() if k not in RUN_LOCAL_ARGUMENTS},
        "attn_implementation": attn_implementation(model),
    }


def trainer_precision(args: Any, model: torch.nn.Module) -> tuple[str, bool]:
    """``(precision, autocast)`` the Trainer's arguments ask for: bf16 / fp16 mixed precision
    is autocast to that dtype; else the parameters' own dtype."""
    if getattr(args, "bf16", False):
        return "bfloat16", True
    if getattr(args, "fp16", False):
        return "float16", True
    return forward_precision(model), False


def trainer_settings(
    args: Any,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    steps: int,
    *,
    framework: tuple[str, str],
    plan: bool = True,
) -> TrainingSettings:
    """The settings of a ``transformers.Trainer`` run (TRL's trainers subclass it) about to take
    ``steps`` optimizer steps: its arguments, adapters, frozen parameters and plan."""
    lrs = None
    if plan and optimizer is not None:
        lrs = planned_lrs([optimizer], [] if scheduler is None else [scheduler], steps)
    precision, autocast = trainer_precision(args, model)
    clip = getattr(args, "max_grad_norm", None)
    checkpointing = bool(getattr(args, "gradient_checkpointing", False)) or gradient_checkpointing(model)
    made = None
    if lrs is not None:
        made = optimizer_plan(
            model,
            optimizer,
            lrs,
            clip_grad=float(clip) if clip else None,
            micro_batches=int(getattr(args, "gradient_accumulation_steps", 1)),
            loss_normalisation=(
                "per_token_over_step"
                if trainer_passes_num_items(model, framework[1])
                else "mean_of_micro_batch_means"
            ),
            precision=precision,
            autocast=autocast,
            gradient_checkpointing=checkpointing,
        )
    return TrainingSettings(
        trainer="hf_trainer",
        framework=framework[0],
        framework_version=framework[1],
        arguments=trainer_arguments(args, model),
        plan=made,
        adapters=adapters_of(model),
        frozen=frozen_parameters(model),
    )


def with_precision(settings: TrainingSettings, precision: str, autocast: bool) -> TrainingSettings:
    """``settings`` whose plan says the forward computed in ``precision`` (as observed)."""
    if settings.plan is None:
        return settings
    plan = dataclasses.replace(settings.plan, precision=precision, autocast=autocast)
    return dataclasses.replace(settings, plan=plan)


# -- a hand-written loop (the Recorder) ---------------------------------------------------------


def _check_loop_settings(
    steps: int, micro_batches: int, loss_normalisation: str | None, precision: str | None
) -> None:
    for key, number in (("steps", steps), ("micro_batches", micro_batches)):
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise ConfigError(f"Recorder.record_settings: {key} must be an integer >= 1, got {number!r}")
    for key, value, allowed in (
        ("loss_normalisation", loss_normalisation, LOSS_NORMALISATIONS),
        ("precision", precision, PRECISIONS),
    ):
        if value is not None and value not in allowed:
            raise ConfigError(
                f"Recorder.record_settings: unknown {key} {value!r} (allowed: {', '.join(allowed)})"
            )


def loop_settings(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    *,
    steps: int,
    clip_grad: float | None,
    micro_batches: int,
    loss_normalisation: str | None,
    precision: str | None,
    autocast: bool,
    gradient_checkpointing: bool | None,
    arguments: Mapping[str, Any],
) -> TrainingSettings:
    """The settings of a loop recorded with the ``Recorder`` (``Recorder.record_settings``;
    its arguments checked here: one ``ConfigError`` each)."""
    _check_loop_settings(steps, micro_batches, loss_normalisation, precision)
    lrs = planned_lrs([optimizer], [] if scheduler is None else [scheduler], steps)
    plan = None
    if lrs is not None:
        plan = optimizer_plan(
            model,
            optimizer,
            lrs,
            clip_grad=clip_grad,
            micro_batches=micro_batches,
            loss_normalisation=loss_normalisation,
            precision=precision or forward_precision(model),
            autocast=autocast,
            gradient_checkpointing=gradient_checkpointing,
        )
    return TrainingSettings(
        trainer="recorder",
        framework="torch",
        framework_version=torch.__version__,
        arguments=json_safe(dict(arguments)),
        plan=plan,
        adapters=adapters_of(model),
        frozen=frozen_parameters(model),
    )
