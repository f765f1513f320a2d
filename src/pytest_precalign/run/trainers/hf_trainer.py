"""A side trained by a real ``transformers.Trainer`` (``training: hf_trainer``, the
LLaMA-Factory path): the case's ``OptimizerSpec`` translated into ``TrainingArguments``
(learning_rate, optim ``adamw_torch`` with adam betas/epsilon, or ``sgd`` with its momentum in
``optim_args``, weight_decay, lr_scheduler_type + warmup_steps, max_grad_norm,
gradient_accumulation_steps, max_steps; plain Adam, which ``optim`` has not, as the Trainer's
``optimizer_cls_and_kwargs=(torch.optim.Adam, ...)``), the case's batches fed in order
(sequential sampling, ``batch / micro_batches`` rows per micro-batch), every layer recorded
by the case's hooks and every step's scalars by a Trainer callback. The translation and the
plan (the LRs the Trainer's own scheduler gives, its parameter groups) go into the manifest.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ...config.specs import CaseSpec, ModelSpec
from ...errors import CaseError
from ...recording import HookRecorder
from ...sources import LoadedModel
from ...sources.inputs import CaseInputs
from ...steps.run_settings import (
    gradient_checkpointing,
    optimizer_settings,
    planned_lrs,
    trainer_precision,
)
from ...steps.spec import OptimizerSpec
from ...steps.step_sink import CaseSink, Deps
from ...trace.records import Record
from ...trace.step_scalars import StepScalars
from ...trace.training_record import RunRecord, TrainingPlan, TrainingSettings
from ...vocabulary import RecordingMode, as_recording_mode
from .case_step import split_micro_batches
from .skeleton import StepSkeleton

# TrainingArguments.optim of each optimizer (plain Adam: none; see ``optimizer_override``).
_OPTIMIZERS = {"adamw": "adamw_torch", "sgd": "sgd", "adam": "adamw_torch"}


def scheduler_arguments(spec: OptimizerSpec) -> dict[str, Any]:
    """``lr_scheduler_type``, ``warmup_steps`` and ``lr_scheduler_kwargs`` for the schedule
    (``steps.spec.hf_trainer_problem``: the config rejected what they cannot express)."""
    schedule = spec.schedule
    if schedule is None:
        return {"lr_scheduler_type": "constant", "warmup_steps": 0, "lr_scheduler_kwargs": {}}
    kind, kwargs = (
        {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[schedule.decay],
        {},
    )
    if schedule.decay == "cosine" and schedule.min_lr > 0:
        kind, kwargs = "cosine_with_min_lr", {"min_lr": schedule.min_lr}
    if schedule.decay == "constant" and schedule.warmup_steps == 0:
        kind = "constant"
    return {"lr_scheduler_type": kind, "warmup_steps": schedule.warmup_steps, "lr_scheduler_kwargs": kwargs}


def training_arguments(
    case: CaseSpec, rows: int, seed: int, output_dir: str, cpu: bool = True, bf16: bool = False
) -> dict[str, Any]:
    """The ``TrainingArguments`` fields the case's optimizer spec becomes (``bf16``: a bf16
    model, trained as HF mixed precision: ``bf16=True``, fp32 master weights)."""
    spec = case.training.optimizer
    if spec.name not in _OPTIMIZERS:
        raise CaseError(
            f"case {case.name!r}: transformers.Trainer has no optimizer for {spec.name!r} "
            f"(allowed: {', '.join(_OPTIMIZERS)})"
        )
    return {
        "output_dir": output_dir,
        "max_steps": case.steps,
        "per_device_train_batch_size": rows // spec.micro_batches,
        "gradient_accumulation_steps": spec.micro_batches,
        "learning_rate": spec.lr,
        "optim": _OPTIMIZERS[spec.name],
        "optim_args": f"momentum={spec.momentum!r}" if spec.name == "sgd" else None,
        "adam_beta1": spec.betas[0],
        "adam_beta2": spec.betas[1],
        "adam_epsilon": spec.eps,
        "weight_decay": spec.weight_decay,
        "max_grad_norm": spec.clip_grad if spec.clip_grad is not None else 0.0,
        **scheduler_arguments(spec),
        "train_sampling_strategy": "sequential",
        "logging_strategy": "steps",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "use_cpu": cpu,  # else the Trainer's accelerator picks the model's device
        "seed": seed,
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
        "bf16": bf16,
    }


def optimizer_override(spec: OptimizerSpec) -> tuple[type[torch.optim.Optimizer], dict[str, Any]] | None:
    """The Trainer's ``optimizer_cls_and_kwargs`` for an optimizer ``optim`` has not (plain
    Adam: ``torch.optim.Adam``, the Trainer's own groups carrying the weight decay); None:
    ``TrainingArguments.optim`` says it."""
    if spec.name != "adam":
        return None
    return torch.optim.Adam, {"lr": spec.lr, "betas": spec.betas, "eps": spec.eps}


class _Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """The case's batches as rows, step after step (sequential sampling keeps the order)."""

    def __init__(self, batches: Sequence[CaseInputs]) -> None:
        self.rows: list[dict[str, torch.Tensor]] = []
        for batch in batches:
            tensors = {k: v for k, v in batch.model_inputs.items() if isinstance(v, torch.Tensor)}
            if batch.labels is not None:
                tensors["labels"] = batch.labels
            for r in range(next(iter(tensors.values())).shape[0]):
                self.rows.append({k: v[r] for k, v in tensors.items()})

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


class HfTrainer:
    """``training: hf_trainer`` (``CaseTrainer``)."""

    def plan(
        self, model: LoadedModel, spec: ModelSpec, data: CaseInputs, case: CaseSpec, seed: int
    ) -> TrainingSettings:
        """The settings (``"training"`` block) this side's Trainer will write, before it
        trains: its Trainer built as ``train`` builds it (the optimizer created, nothing
        trained) and its plan made by the same ``_plan``."""
        rows = data.rows
        bf16 = any(p.dtype == torch.bfloat16 for p in model.module.parameters())
        with (
            tempfile.TemporaryDirectory(prefix="precalign-trainer-") as out,
            fp32_master_weights(model.module),
        ):
            trainer, arguments = _trainer(model.module, case, rows, seed, out, bf16=bf16)
            return _training_block(
                arguments, _plan(trainer, case, model.module), case.training.optimizer, bf16
            )

    def train(self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton) -> RunRecord:
        """Train ``model`` with a ``transformers.Trainer`` through the case's steps while the
        recorder's hooks record it (only the boundary's step, when given: training stops
        after it); returns the manifest's training evidence."""
        batches = [data.batch(s) for s in range(case.steps)]
        for batch in batches:  # equal micro-batches, as the Trainer's dataloader will cut them
            split_micro_batches(batch, case.training.optimizer.micro_batches, case)
        rows = batches[0].rows
        callbacks = _case_steps(steps)
        bf16 = any(p.dtype == torch.bfloat16 for p in model.module.parameters())
        seed = steps.seed
        with (
            tempfile.TemporaryDirectory(prefix="precalign-trainer-") as out,
            fp32_master_weights(model.module),
        ):
            trainer, arguments = _trainer(
                model.module, case, rows, seed, out, _Rows(batches), callbacks, bf16=bf16
            )
            plan = _plan(trainer, case, model.module)
            try:
                trainer.train()
            finally:
                steps.end()
        callback = callbacks[-1]  # TrainerSteps
        _check_steps(callback.scalars, case, steps.count(case.steps))
        settings = _training_block(arguments, plan, case.training.optimizer, bf16)
        return RunRecord(settings, dict(callback.scalars), callback.initial or {})


TRAINER = HfTrainer()


MASTER_WEIGHTS = {
    "master_params_dtype": "float32",  # the bf16 params upcast for training, cast back after it
    "recorded_params": "model params (the float32 master weights the optimizer steps)",
}


@contextmanager
def fp32_master_weights(module: torch.nn.Module) -> Iterator[None]:
    """HF mixed precision for a bf16 model: its bf16 parameters upcast to float32 master
    weights for the run (LLaMA-Factory's default for bf16 training unless ``pure_bf16``), the
    Trainer's ``bf16=True`` autocasting the forward to bf16; afterwards the parameters go back
    to the dtype they had and accelerate's autocast wrapper leaves the model's ``forward``."""
    dtypes = {name: p.dtype for name, p in module.named_parameters()}
    keys = ("forward", "_original_forward")  # accelerate wraps forward in autocast
    own: dict[str, Any] = {key: module.__dict__[key] for key in keys if key in module.__dict__}
    for param in module.parameters():
        if param.dtype == torch.bfloat16:
            param.data = param.data.float()
    try:
        yield
    finally:
        for name, param in module.named_parameters():
            param.data = param.data.to(dtypes[name])
            if param.grad is not None:
                param.grad = param.grad.to(dtypes[name])
        for key in keys:
            module.__dict__.pop(key, None)
        module.__dict__.update(own)


def _trainer(
    module: torch.nn.Module,
    case: CaseSpec,
    rows: int,
    seed: int,
    out: str,
    dataset: Any = None,
    callbacks: Sequence[Any] = (),
    *,
    bf16: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """The side's ``transformers.Trainer`` with its optimizer created (``create_optimizer``),
    and the ``TrainingArguments`` fields it was given."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    cpu = all(p.device.type == "cpu" for p in module.parameters())
    arguments = training_arguments(case, rows, seed, out, cpu, bf16)
    trainer = Trainer(
        model=module,
        args=TrainingArguments(**arguments),
        train_dataset=dataset,
        callbacks=list(callbacks),
        optimizer_cls_and_kwargs=optimizer_override(case.training.optimizer),
    )
    trainer.remove_callback(PrinterCallback)  # the case's report says what happened
    trainer.create_optimizer()
    return trainer, arguments


class _CaseSink(CaseSink):
    """The Trainer case's ``StepSink``: each step through the skeleton into its recorder (the
    outputs of the steps the boundary does not pause; the parameters once updated); the
    settings and scalars are the case's and ``TrainerSteps``' own."""

    def __init__(self, steps: StepSkeleton, recorder: HookRecorder) -> None:
        self.steps, self.recorder = steps, recorder
        self.mode: RecordingMode = as_recording_mode(recorder.mode)
        self.optimizer: Any = None  # the step's, as the Trainer's event hands it (``_case_steps``)
        self.at = 0

    def seek(self, step: int) -> None:
        self.at = step

    def start(self, model: torch.nn.Module | Sequence[torch.nn.Module]) -> None:
        assert isinstance(model, torch.nn.Module)  # the Trainer's model
        self.steps.begin(self.at, model, self.optimizer)

    def record_output(
        self, kind: str, tensor: Tensor, deps: Deps = (), name: str | None = None, call: int | None = None
    ) -> Record | None:
        if self.steps.quiet:
            return None
        return self.recorder.record_output("logits" if kind == "logits" else "loss", tensor, call=call or 0)

    def updated(self) -> None:
        self.steps.updated()

    def close(self, failed: bool = False) -> None:
        self.steps.end()


def _case_steps(steps: StepSkeleton) -> list[Any]:
    """The Trainer callbacks of a case, in the order the Trainer calls them: one handing the
    case's sink each step's optimizer and stopping training after the boundary's step (only
    the boundary's step when given: the steps before it run paused, the state is loaded where
    it starts), then the shared step callback (``TrainerSteps``) writing into the sink."""
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from ...training.hf_callback import TrainerSteps

    assert steps.recorder is not None
    sink = _CaseSink(steps, steps.recorder)

    class CaseEvents(TrainerCallback):
        def on_step_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> None:
            sink.optimizer = kwargs.get("optimizer")

        def on_step_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> None:
            if steps.past(state.global_step):
                control.should_training_stop = True  # global_step counts the update just made

    return [CaseEvents(), TrainerSteps(sink)]


def _plan(trainer: Any, case: CaseSpec, module: torch.nn.Module) -> TrainingPlan:
    """The Trainer's own parameter groups, and the LRs its own scheduler gives each update
    (``transformers.get_scheduler``, as ``create_scheduler`` calls it, on a throwaway optimizer
    over the side's own parameters in the Trainer's groups: what a user's patch of the
    scheduler does to this model shows; only the scheduler is stepped)."""
    from transformers import get_scheduler

    names = {id(p): n for n, p in module.named_parameters()}
    groups = trainer.optimizer.param_groups
    args = trainer.args
    throwaway = torch.optim.SGD([{"params": list(g["params"])} for g in groups], lr=args.learning_rate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": on purpose
        scheduler = get_scheduler(
            args.lr_scheduler_type,
            optimizer=throwaway,
            num_warmup_steps=args.get_warmup_steps(case.steps),
            num_training_steps=case.steps,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs,
        )
    lrs = planned_lrs([throwaway], [scheduler], case.steps)
    if lrs is None:
        raise CaseError(
            f"case {case.name!r}: lr_scheduler_type {args.lr_scheduler_type!r} decides from metrics "
            "or cannot be put back: no plan of its LRs can be made before training"
        )
    precision, autocast = trainer_precision(args, module)
    clip = args.max_grad_norm
    return TrainingPlan(
        lr=lrs,
        weight_decay=tuple(float(g.get("weight_decay", 0.0)) for g in groups),
        groups=tuple(tuple(names[id(p)] for p in g["params"]) for g in groups),
        clip_grad=float(clip) if clip is not None and clip > 0 else None,  # the Trainer clips when > 0
        micro_batches=args.gradient_accumulation_steps,
        loss_normalisation="per_token_over_step",  # num_items_in_batch over the step's micro-batches
        precision=precision,
        autocast=autocast,  # the Trainer's mixed precision autocasts the forward
        gradient_checkpointing=bool(args.gradient_checkpointing) or gradient_checkpointing(module),
        **optimizer_settings(trainer.optimizer),
    )


def _training_block(
    arguments: Mapping[str, Any], plan: TrainingPlan, spec: OptimizerSpec, bf16: bool
) -> TrainingSettings:
    import transformers

    kept = {k: v for k, v in arguments.items() if k not in ("output_dir", "report_to", "disable_tqdm")}
    given: dict[str, Any] = {
        "TrainingArguments": kept,
        "decay_parameters": "Trainer.get_decay_parameter_names",
    }
    override = optimizer_override(spec)
    if override is not None:
        cls, kwargs = override
        given["optimizer_cls_and_kwargs"] = {
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()},
            "note": "overrides TrainingArguments.optim",
        }
    if bf16:
        given |= MASTER_WEIGHTS
    return TrainingSettings("hf_trainer", "transformers", transformers.__version__, given, plan)


def _check_steps(scalars: Mapping[int, StepScalars], case: CaseSpec, last: int) -> None:
    if sorted(scalars) != list(range(last)):
        raise CaseError(
            f"case {case.name!r}: transformers.Trainer ran steps {sorted(scalars)}, the case has "
            f"{last} (0..{last - 1})"
        )
