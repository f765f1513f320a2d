"""A side trained by megatron-core's own stack (``training: megatron``, the default for a
``source: megatron`` model): ``megatron_core.megatron_stack`` (DDP, ``get_megatron_optimizer``,
``OptimizerParamScheduler``, ``finalize_model_grads``, the pipeline schedule) through the case's
steps, each step's batch split into ``optimizer.micro_batches`` micro-batches, every layer
recorded by the case's hooks and every step's ``StepScalars`` kept. Returns what the side's
manifest gains: ``training`` (megatron-core's arguments and plan), ``scalars``,
``initial_params``.

The recorder must be made with ``param_grads="step"`` (the registry entry's): Megatron's DDP accumulates each
micro-batch's grad into ``main_grad`` and ``finalize_model_grads`` divides the sum by the step's
tokens, so the grads the optimizer steps on exist only after the schedule; they are recorded
then (``main_grad``), as the other frameworks' accumulated grads are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ...config.specs import CaseSpec, ModelSpec
from ...errors import CaseError
from ...megatron_core.megatron_stack import build_megatron_stack, plan_before_training
from ...redaction import redacted
from ...sources import LoadedModel
from ...sources.inputs import CaseInputs
from ...steps.step_evidence import initial_params
from ...trace.checksums import verify_file, write_checked_file
from ...trace.step_scalars import StepScalars
from ...trace.training_record import RunRecord, TrainingSettings, read_evidence_file, run_record_keys
from ...untrusted import read_json
from .skeleton import StepSkeleton


def micro_batches(batch: CaseInputs, count: int, case: CaseSpec) -> list[dict[str, torch.Tensor]]:
    """``batch`` as ``count`` equal micro-batches along dim 0 (``labels`` included)."""
    if batch.labels is None:
        raise CaseError(f"case {case.name!r}: training: megatron needs labels (inputs: {{labels: true}})")
    tensors = {k: v for k, v in batch.model_inputs.items() if isinstance(v, torch.Tensor)}
    tensors["labels"] = batch.labels
    rows = int(batch.labels.shape[0])
    if rows % count:
        raise CaseError(f"case {case.name!r}: micro_batches {count} does not divide the batch of {rows} rows")
    parts = {k: v.chunk(count) for k, v in tensors.items()}
    return [{k: v[i] for k, v in parts.items()} for i in range(count)]


def chunk_forward(model: LoadedModel) -> Callable[[torch.nn.Module, Mapping[str, Any]], torch.Tensor]:
    """The side's forward through the stack's chunk (``DistributedDataParallel``, and
    ``Float16Module`` for a bf16 model), as Megatron-LM's forward step calls the model."""

    def forward(chunk: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return model.logits(model.caller(chunk, inputs) if model.caller is not None else chunk(**inputs))

    return forward


class MegatronTrainer:
    """``training: megatron`` (``LaunchedTrainer``)."""

    def plan(
        self, model: LoadedModel, spec: ModelSpec, data: CaseInputs, case: CaseSpec, seed: int
    ) -> TrainingSettings:
        """The settings (``"training"`` block) this side's stack will write, before it is
        built (``megatron_stack.plan_before_training``; a launched side planned from its TP=1
        twin over its data-parallel replicas)."""
        from ...sources.megatron import data_parallel

        optimizer = case.training.optimizer
        return plan_before_training(
            [model.module], optimizer, case.steps, data.rows, optimizer.micro_batches,
            data_parallel=data_parallel(spec),
        )  # fmt: skip

    def train(self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton) -> RunRecord:
        """Train ``model`` (a megatron-core module of this process) through the case's steps
        while the recorder (entered, ``param_grads="step"``) records; the manifest's training
        evidence. The torch optimizer inside Megatron's ``FP32Optimizer`` is what is handed
        over at the step replay's boundary."""
        recorder = steps.recorder
        assert recorder is not None
        if case.training.loss != "causal_lm":
            raise CaseError(
                f"case {case.name!r}: training: megatron (a Megatron model's default) computes loss "
                f"causal_lm, not {case.training.loss!r}; set training: loop for the tool's loop"
            )
        if recorder.param_grads != "step":
            raise CaseError(f"case {case.name!r}: training: megatron records grads at param_grads='step'")
        module = model.module
        spec = case.training.optimizer
        initial = initial_params(module.named_parameters())
        stack = build_megatron_stack([module], spec, case.steps, global_batch=data.rows)
        training = stack.training_manifest(case.steps, spec.micro_batches)
        forward = chunk_forward(model)
        calls: dict[str, int] = {}

        def on_output(kind: str, tensor: torch.Tensor) -> None:  # call k: the step's micro-batch k
            call = calls.get(kind, 0)
            calls[kind] = call + 1
            recorder.record_output("logits" if kind == "logits" else "loss", tensor, call=call)

        scalars: dict[int, StepScalars] = {}
        for step in steps.steps(case.steps, module, lambda: torch_optimizer(stack.optimizer, module)):
            calls.clear()
            parts = micro_batches(data.batch(step), spec.micro_batches, case)
            _, scalars[step] = stack.train_step(
                step,
                parts,
                forward,
                on_output=None if steps.quiet else on_output,
                grads_ready=None if steps.quiet else partial(recorder.record_param_grads, len(parts)),
            )
            steps.updated()
        return RunRecord(training, scalars, initial)

    def train_rank(
        self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton, out: Path, rank: int
    ) -> None:
        train_rank_with_megatron(model, data, case, steps, out, rank)

    def launched_evidence(
        self, out: Path, nproc: int, full_weights: Mapping[str, torch.Tensor] | None
    ) -> RunRecord:
        return launched_evidence(out, nproc, full_weights)


TRAINER = MegatronTrainer()


def torch_optimizer(optimizer: Any, module: torch.nn.Module) -> Any:
    """The torch optimizer inside Megatron's ``FP32Optimizer`` when it steps on ``module``'s
    own parameters; else a ``CaseError`` (a chained optimizer, fp32 main copies of bf16
    parameters: their state is not the model's parameters')."""
    inner = getattr(optimizer, "optimizer", None)
    own = {id(p) for p in module.parameters()}
    stepped = [p for g in getattr(inner, "param_groups", ()) for p in g["params"]]
    if inner is None or not stepped or any(id(p) not in own for p in stepped):
        raise CaseError(
            f"megatron's {type(optimizer).__name__} does not step on the model's own parameters "
            "(fp32 main copies, or chained optimizers): its state cannot be loaded by parameter"
        )
    return inner


TRAINING_FILE = "training_rank{rank}.json"


def train_rank_with_megatron(
    model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton, out: Path, rank: int
) -> None:
    """One launched rank of a ``training: megatron`` side (``rank_main``): its stage and shard
    trained by megatron-core's stack through the case's steps, recorded with the public
    ``Recorder`` into ``out/step<N>/rank<R>`` (grads as ``main_grad`` after
    ``finalize_model_grads``), and its plan and scalars written to ``out/training_rank<R>.json``
    (parameter names global: the stage's layer offset added)."""
    from ...megatron_core.megatron_dp import data_parallel_rank, reduced_main_grads, replica_share
    from ...parallel.merge import globalize
    from ...steps.layout_probe import layer_offsets
    from ...training import Recorder

    if case.training.loss != "causal_lm":
        raise CaseError(
            f"case {case.name!r}: training: megatron computes loss causal_lm, not {case.training.loss!r}"
        )
    module = model.module
    module.train(case.training.train)
    spec = case.training.optimizer
    offsets = layer_offsets(module)
    rows = data.rows
    dp, dp_rank = data_parallel_rank()
    _check_split(case, spec.micro_batches, dp)
    stack = build_megatron_stack(
        [module], spec, case.steps, global_batch=rows, names=lambda _, name: globalize(name, offsets),
        data_parallel=dp,
    )  # fmt: skip
    settings = stack.training_manifest(case.steps, spec.micro_batches)
    rec = Recorder(
        out, mode=case.record.mode, level=case.record.level, inputs=case.record.inputs, grads=True,
        include=case.record.include, exclude=case.record.exclude, params=True, param_grads="step",
    )  # fmt: skip

    forward = chunk_forward(model)

    def on_output(kind: str, tensor: torch.Tensor) -> None:
        rec.record_output(kind, tensor)

    def grads_ready() -> None:  # the step's whole reduced grads, as the last micro-batch's call
        with reduced_main_grads(stack.chunks):
            rec.grads_ready(spec.micro_batches)

    scalars: dict[int, StepScalars] = {}
    for step in steps.steps(case.steps, module):
        rec.start(module)
        every = micro_batches(data.batch(step), spec.micro_batches, case)
        parts = replica_share(every, dp, dp_rank)  # this replica's share of the step's micro-batches
        _, scalars[step] = stack.train_step(
            step, parts, forward, on_output=on_output, grads_ready=grads_ready, step_batches=every,
            data_parallel=dp,
        )  # fmt: skip
        rec.stop()
        rec.step()
    write_evidence(out, rank, run_record_keys(settings, scalars))


def write_evidence(out: Path, rank: int, record: Mapping[str, Any]) -> Path:
    """A rank's training evidence file, through the recordings' path: redacted (no secret),
    written atomically, its sha256 beside it (``trace.checksums``), checked when read."""
    data = json.dumps(redacted(dict(record))).encode("utf-8")
    return write_checked_file(out / TRAINING_FILE.format(rank=rank), data)


def _check_split(case: CaseSpec, micro: int, dp: int) -> None:
    if micro % dp:
        raise CaseError(
            f"case {case.name!r}: optimizer.micro_batches {micro} cannot be split over data_parallel {dp} "
            "replicas: each replica runs micro_batches / data_parallel of every step's micro-batches"
        )


def launched_evidence(out: Path, nproc: int, full_weights: Mapping[str, torch.Tensor] | None) -> RunRecord:
    """The side's training evidence from its ranks' files: the plan's groups united over the
    ranks (each holds its stage's parameters; tensor-parallel ranks name the same ones), the
    scalars of the rank that has the loss (the last pipeline stage; grad norm, zero count and
    the update and parameter norms are the model's on every rank), the initial parameters
    from the full TP=1 weights the ranks loaded."""
    ranks = []
    for rank in range(nproc):
        path = out / TRAINING_FILE.format(rank=rank)
        if not path.exists():
            raise CaseError(f"launched rank {rank} wrote no training evidence ({path.name})")
        verify_file(path, CaseError)
        record = read_evidence_file(read_json(path, CaseError), path.name)
        if record.plan is None or record.settings is None:
            raise CaseError(f"launched rank {rank} wrote no training plan ({path.name})")
        ranks.append((record.settings, record.plan, record.scalars))
    settings, plan, _ = ranks[0]
    groups: list[list[str]] = [[] for _ in plan.groups]
    for _, own, _ in ranks:
        for index, names in enumerate(own.groups):
            groups[index] += [n for n in names if n not in groups[index]]
    united = replace(settings, plan=replace(plan, groups=tuple(tuple(names) for names in groups)))
    with_loss = [s for _, _, s in ranks if all(step.loss is not None for step in s.values())]
    chosen = (with_loss or [s for _, _, s in ranks])[-1]
    initial = None if full_weights is None else initial_params(full_weights.items())
    return RunRecord(united, chosen, initial)
