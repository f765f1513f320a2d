"""One megatron-core training step, as Megatron-LM's ``train_step`` runs it, with what it did
recorded as ``StepScalars``: ``megatron_train_step(...)``.

The step is megatron-core's own: the DDP chunks' grad buffers zeroed
(``zero_grad_buffer``), ``get_forward_backward_func()`` over ``num_microbatches`` (it ends
with the config's ``finalize_model_grads_func``: the data-parallel and tensor-parallel grad
reductions, the per-token division), ``optimizer.step()`` (unscale, clip, count zeros,
update; its return value is the grad norm before clipping), then ``scheduler.step(increment)``
after a successful update. All of it runs inside ``megatron_cpu()`` on a CPU-only torch.

>>> from pytest_precalign.megatron_core.megatron_step import megatron_train_step
>>> for step, batch in enumerate(batches):
...     losses, scalars = megatron_train_step(
...         step=step, forward_step_func=forward_step, data_iterator=iter(batch.chunk(2)),
...         model=ddp_chunks, optimizer=optimizer, scheduler=scheduler,
...         num_microbatches=2, seq_length=32, micro_batch_size=2, increment=global_batch)
...     recorder.record_scalars(scalars)   # or keep them yourself

What is recorded (nothing is written: loss, LR and grad norm are bitwise those of the same step
without recording):

- ``lr``/``weight_decay``: each optimizer group's, read just before ``optimizer.step()`` (the
  LR this update uses, set by the scheduler's previous ``step``);
- ``grad_norm``: the norm ``optimizer.step()`` returns (Megatron's ``get_grad_norm_fp32`` over
  its main grads, model-parallel reduced); ``clip_coef``: Megatron's grad norm of the main
  grads after the step divided by it (1.0 when nothing was clipped, measured, not assumed);
- ``zero_grads``: Megatron's own ``num_zeros_in_grad`` (``log_num_zeros_in_grad``) when its
  config counts them, else counted on the main grads;
- ``loss_scale``: ``optimizer.get_loss_scale()``; ``skipped``: the step's update failed
  (inf/nan under a loss scaler);
- ``update_norm``/``param_norm``: the model parameters' change and norm (this rank's), over
  the fp32 ``main_param`` of a bf16 model's parameters (the copies the optimizer steps);
- ``loss``: the step's loss from the schedule's reduced losses (see ``reported_loss``; None
  on a pipeline stage without the loss; with data-parallel replicas, summed over them);
  ``tokens``/``batch_hash``: from ``batches`` when given (with data parallelism: the whole
  step's); ``micro_batches``: ``num_microbatches`` times the data-parallel replicas.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..steps.step_evidence import StepEvidence, batch_hashes, group_settings, token_count, zero_count
from ..trace.step_scalars import StepScalars
from .megatron_cpu_patch import megatron_cpu
from .megatron_dp import data_parallel_rank


def reported_loss(losses: Sequence[Mapping[str, Any]]) -> float | None:
    """The step's loss from ``forward_backward_func``'s list (one dict per micro-batch, on the
    last pipeline stage; empty elsewhere). A value of two numbers ``[sum, tokens]`` (the
    ``calculate_per_token_loss`` convention of Megatron-LM's ``loss_func``) gives sum of sums /
    sum of tokens; a scalar gives the mean over micro-batches. The first key of each dict."""
    if not losses:
        return None
    total, count = _loss_parts(losses)
    return total / count if count else None


def _loss_parts(losses: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """(sum of sums, tokens) of ``[sum, tokens]`` values, else (sum of scalars, how many)."""
    values = [torch.as_tensor(next(iter(item.values()))).detach().double().reshape(-1) for item in losses]
    if all(v.numel() == 2 for v in values):
        return sum(float(v[0]) for v in values), sum(float(v[1]) for v in values)
    return sum(float(v[0]) for v in values), float(len(values))


def _data_parallel_loss(losses: Sequence[Mapping[str, Any]]) -> float | None:
    """``reported_loss`` of the whole step when data-parallel replicas each ran their share of
    its micro-batches: the parts summed over megatron-core's data-parallel group."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps

    if not losses or not ps.model_parallel_is_initialized() or ps.get_data_parallel_world_size() == 1:
        return reported_loss(losses)
    import torch.distributed as dist

    parts = torch.tensor(_loss_parts(losses), dtype=torch.float64)
    dist.all_reduce(parts, group=ps.get_data_parallel_group())
    return float(parts[0] / parts[1]) if float(parts[1]) else None


def _main_grads(optimizer: Any) -> list[torch.Tensor]:
    return [g for g in optimizer.get_main_grads_for_grad_norm() if g is not None]


def _data(batches: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """The step's ``tokens``, ``batch_hash`` and ``rows_hash`` (None without ``batches``)."""
    if batches is None:
        return {"tokens": None, "batch_hash": None, "rows_hash": None}
    digest, rows = batch_hashes(batches)
    return {"tokens": token_count(batches), "batch_hash": digest, "rows_hash": rows}


def megatron_train_step(
    *,
    step: int,
    forward_step_func: Callable[..., Any],
    data_iterator: Iterator[Any] | list[Iterator[Any]],
    model: Sequence[torch.nn.Module],
    optimizer: Any,
    scheduler: Any,
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
    increment: int = 1,
    batches: Sequence[Mapping[str, Any]] | None = None,
    grads_ready: Callable[[], Any] | None = None,
) -> tuple[list[dict[str, Any]], StepScalars]:
    """One step of megatron-core's ``model`` chunks (DDP) with its ``optimizer`` and
    ``scheduler``: the schedule's losses and the step's scalars. ``grads_ready`` is called once
    the grads are reduced, before ``optimizer.step()`` (e.g. ``Recorder.grads_ready``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel import get_forward_backward_func

    chunks = list(model)
    evidence = _zero_grads(chunks, optimizer)
    with megatron_cpu(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core's deprecation notices
        losses = get_forward_backward_func()(
            forward_step_func=forward_step_func,
            data_iterator=data_iterator,
            model=chunks,
            num_microbatches=num_microbatches,
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            forward_only=False,
        )
        if grads_ready is not None:
            grads_ready()
        lr, weight_decay = group_settings(optimizer)
        successful, grad_norm, num_zeros = optimizer.step()
        clip_coef, zeros = _after_step(optimizer, successful, grad_norm, num_zeros)
    if successful:
        scheduler.step(increment=increment)
    norms = _model_parallel_norms(evidence)
    scalars = evidence.finish(
        step,
        loss=_data_parallel_loss(losses),
        lr=lr,
        weight_decay=weight_decay,
        grad_norm=float(grad_norm) if grad_norm is not None else None,
        clip_coef=clip_coef,
        zero_grads=zeros,
        loss_scale=float(optimizer.get_loss_scale().reshape(-1)[0]),
        skipped=not successful,
        **_data(batches),
        micro_batches=num_microbatches * data_parallel_rank()[0],  # the step's, over the DP replicas
        **norms,
    )
    return list(losses), scalars


def _stepped(param: torch.Tensor) -> torch.Tensor:
    """The copy of ``param`` the optimizer steps: its fp32 ``main_param`` under
    ``Float16OptimizerWithFloat16Params``, else itself."""
    main = getattr(param, "main_param", None)
    return main if isinstance(main, torch.Tensor) else param


def _zero_grads(chunks: Sequence[torch.nn.Module], optimizer: Any) -> StepEvidence:
    """Megatron-LM's start of a step (the DDP grad buffers and the optimizer's grads zeroed);
    the step's evidence, begun (its parameter snapshot)."""
    evidence = StepEvidence([_stepped(p) for chunk in chunks for p in chunk.parameters()])
    for chunk in chunks:
        zero_buffer = getattr(chunk, "zero_grad_buffer", None)
        if zero_buffer is not None:
            zero_buffer()
    optimizer.zero_grad()
    evidence.begin()
    return evidence


def _after_step(
    optimizer: Any, successful: bool, grad_norm: Any, num_zeros: Any
) -> tuple[float | None, int | None]:
    """(clip coefficient, zero grads) of a step: the coefficient measured as Megatron's norm of
    the main grads after the step over the norm before (they keep the clipped values until the
    next zero_grad); the zeros as Megatron counted them, else counted here."""
    if not successful or grad_norm is None:
        return None, None
    clip_coef = float(optimizer.get_grad_norm()) / float(grad_norm) if float(grad_norm) > 0 else 1.0
    if num_zeros is not None and getattr(optimizer.config, "log_num_zeros_in_grad", False):
        return clip_coef, int(num_zeros)
    return clip_coef, zero_count(_main_grads(optimizer))


def _model_parallel_norms(evidence: StepEvidence) -> dict[str, float]:
    """With tensor, pipeline or expert parallelism: the update and parameter norms of the whole
    model (each parameter once: no tensor-parallel duplicates), the squares summed over
    Megatron's model-parallel group, an expert-parallel rank's experts' over the
    expert-parallel group; {} in one process (StepEvidence's own norms are the model's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    if not ps.model_parallel_is_initialized():
        return {}
    model_parallel, ep = ps.get_model_parallel_group(), ps.get_expert_model_parallel_world_size()
    before = evidence._before
    if before is None or (model_parallel.size() == 1 and ep == 1):
        return {}
    import torch.distributed as dist

    shared, experts = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for param, old in zip(evidence.params, before, strict=True):
            if param_is_not_tensor_parallel_duplicate(param):
                own = experts if ep > 1 and not getattr(param, "allreduce", True) else shared
                own[0] += (param.detach().double() - old.double()).square().sum()
                own[1] += param.detach().double().square().sum()
    if model_parallel.size() > 1:
        dist.all_reduce(shared, group=model_parallel)
    if ep > 1:
        dist.all_reduce(experts, group=ps.get_expert_model_parallel_group())
    total = shared + experts
    return {"update_norm": float(total[0].sqrt()), "param_norm": float(total[1].sqrt())}
