"""A user's own data-parallel training loop recorded with ``pytest_precalign.Recorder``: the
same global batch (4 rows of 12 tokens a step) trained in one process, or split over the ranks
of a torchrun job, each rank training its own rows (DDP, or ZeRO-1's
``ZeroRedundancyOptimizer``); AdamW, warmup, clipping at 1.0, each step's scalars recorded
with ``record_scalars``.

    python sharded_loop.py OUT RUN [RUN ...]                                    # one process
    python -m torch.distributed.run --standalone --nproc_per_node 2 sharded_loop.py OUT RUN ...

Each RUN is ``NAME`` or ``NAME:key=value,...``, recorded under ``OUT/NAME``. Keys: ``wrap``
(ddp | fsdp2 | zero1 | tp | fsdp2_tp | none; none in one process; tp: ``parallelize_module`` with
``ColwiseParallel`` q/k/v, gate and up projections and ``RowwiseParallel`` o and down ones over every
rank; ``tp_style``: plain, ``sp`` (also ``SequenceParallel`` on the norms: the residual stream split
along the sequence, the embedding and o/down projections' outputs reduce-scattered to it, attention,
MLP and ``lm_head`` inputs gathered), ``dtensor_out`` (gate and up projections with
``use_local_output=False``: DTensors handed on to ``act_fn`` and ``down_proj``), ``custom`` (gate
and up projections under the user's own ``ParallelStyle`` subclass, ``OwnColwise``), ``titan``
(``sp`` with the MLP under ``PrepareModuleInputOutput``: its output split along the sequence by the
style), ``prepared`` (``plain`` with ``PrepareModuleInput`` on the attention and MLP and the final
norm's output split along the sequence by ``PrepareModuleOutput``); fsdp2_tp: the same over the ``tp`` dim of a (dp=2, tp) mesh, FSDP2 over ``dp``, 4 ranks), ``total`` (steps trained, 6), ``micro`` (micro-batches per rank and step: gradient
accumulation), ``mode`` (stats | tensor | hash | scalars), ``steps`` (the steps whose layers are
recorded, ``3+4``; default all), ``param_grads`` (backward | step). Faults from step k, on the
last rank only where said: ``scale_rank_from=k`` (the last rank's parameter grads x 2 before
the reduction: a wrong averaging), ``loss_rank_from=k`` (the last rank's backward of twice its
loss: the same fault where the parameters' grad hooks do not run, FSDP2), ``lr_from=k`` (the LR halved), ``local_norm_from=k`` (each rank
clips with the norm of the grads of the parameters it owns, as a ZeRO/FSDP shard would: not the
global norm), ``stale_from=k`` (the last rank's ``model.layers.1.mlp.down_proj`` runs on its
weight of the step before: a stale parameter after a missing re-gather), ``tp_shard_from=k`` (the
last rank's share of ``model.layers.1.mlp.down_proj``'s row-parallel output, its partial sum
before the all-reduce, doubled: one TP rank's shard wrong), ``tp_grad_from=k`` (the last rank's
local shard of ``model.layers.1.mlp.down_proj.weight``'s grad doubled: one TP rank's grad
wrong), ``shuffle_from=k`` (every rank
draws its rows from its own shuffle of the data, seeded by its rank: other rows than the
global batch's).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tiny_setup import VOCAB, sweep, tiny_qwen2

from pytest_precalign import Recorder
from pytest_precalign.steps.step_evidence import StepEvidence, batch_hashes, group_settings, token_count

STEPS, ROWS, SEQ, WARMUP, CLIP = 6, 4, 12, 2, 1.0
BASELINE: dict[str, Any] = {
    "wrap": "none",
    "total": STEPS,
    "micro": 1,
    "mode": "stats",
    "steps": None,
    "param_grads": "backward",
    "scale_rank_from": None,
    "loss_rank_from": None,
    "lr_from": None,
    "local_norm_from": None,
    "stale_from": None,
    "tp_shard_from": None,
    "tp_grad_from": None,
    "shuffle_from": None,
    "tp_style": "plain",
    "golden": None,
}


def global_rows() -> torch.Tensor:
    """Every step's global batch: ``STEPS * ROWS`` rows of ``SEQ`` token ids, one seed."""
    gen = torch.Generator().manual_seed(1)
    return torch.randint(2, VOCAB, (STEPS * ROWS, SEQ), generator=gen)


def _on(key: str, run: dict[str, Any], step: int) -> bool:
    return run[key] is not None and step >= run[key]


def plant_faults(model: torch.nn.Module, run: dict[str, Any], last: bool, step_now: list[int]) -> None:
    """The run's faults that live in the model: on the last rank only."""
    if run["scale_rank_from"] is not None and last:
        for p in model.parameters():
            p.register_hook(lambda g: g * 2 if step_now[0] >= run["scale_rank_from"] else g)
    if run["stale_from"] is not None and last:
        down = model.model.layers[1].mlp.down_proj  # type: ignore[union-attr, index]
        stale: list[torch.Tensor] = []

        def keep(module: Any, args: Any) -> None:
            stale[:] = [*stale[-1:], module.weight.detach().clone()]

        def use_stale(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor | None:
            if step_now[0] < run["stale_from"]:
                return None
            weight = stale[0] + (module.weight - module.weight.detach())  # old values, live grads
            return torch.nn.functional.linear(args[0], weight)

        down.register_forward_pre_hook(keep)
        down.register_forward_hook(use_stale)
    if run["tp_shard_from"] is not None and last:  # registered before parallelize_module's hooks
        from torch.distributed.tensor import DTensor

        def double_share(module: Any, args: Any, output: Any) -> Any:
            if step_now[0] < run["tp_shard_from"]:
                return None
            return DTensor.from_local(
                output.to_local() * 2, output.device_mesh, output.placements, run_check=False
            )

        model.model.layers[1].mlp.down_proj.register_forward_hook(double_share)  # type: ignore[union-attr, index]


def optimizer_of(model: torch.nn.Module, run: dict[str, Any]) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    if run["wrap"] == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        zero = ZeroRedundancyOptimizer(decay, optimizer_class=torch.optim.AdamW, lr=5e-3, weight_decay=0.1)
        zero.add_param_group({"params": no_decay, "weight_decay": 0.0})
        return zero
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=5e-3)


def plant_grad_fault(model: torch.nn.Module, run: dict[str, Any], last: bool, step_now: list[int]) -> None:
    """``tp_grad_from``: the last rank's local shard of ``model.layers.1.mlp.down_proj.weight``'s
    grad doubled (a hook on the parameter ``parallelize_module`` made)."""
    if run["tp_grad_from"] is not None and last:
        weight = model.model.layers[1].mlp.down_proj.weight  # type: ignore[union-attr, index]
        weight.register_hook(lambda g: g * 2 if step_now[0] >= run["tp_grad_from"] else g)


def wrap(model: torch.nn.Module, run: dict[str, Any], world: int) -> torch.nn.Module:
    """The model as the run trains it: DDP, FSDP2 (``fully_shard`` on each decoder layer and
    the root), DTensor tensor parallelism of each MLP, or itself (zero1: ZeRO-1 shards only the
    optimizer; the grads are averaged by hand)."""
    if run["wrap"] == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if run["wrap"] in ("fsdp2", "tp", "fsdp2_tp"):
        from torch.distributed.device_mesh import init_device_mesh

        dims = (2, world // 2) if run["wrap"] == "fsdp2_tp" else (world,)
        names = ("dp", "tp") if run["wrap"] == "fsdp2_tp" else ("tp" if run["wrap"] == "tp" else "dp",)
        full = init_device_mesh("cpu", dims, mesh_dim_names=names)
        tp_mesh, mesh = (full["tp"], full["dp"]) if len(dims) == 2 else (full, full)
        layers = model.model.layers  # type: ignore[union-attr]
        if run["wrap"] in ("tp", "fsdp2_tp"):
            from tp_styles import parallelize

            parallelize(model, tp_mesh, run["tp_style"])
            if run["wrap"] == "tp":
                return model
        from torch.distributed.fsdp import fully_shard

        for layer in layers:  # type: ignore[union-attr]
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank


def clip(params: list[torch.nn.Parameter], owned: list[torch.nn.Parameter], local: bool) -> float:
    """Clip at ``CLIP`` with the global grad norm; the norm used. ``local`` (the fault): the
    norm of this rank's shard of the grads only (FSDP2: each DTensor grad's local shard; else
    the grads of the parameters the rank owns, as a ZeRO partition)."""
    sharded = [hasattr(p.grad, "to_local") for p in params if p.grad is not None]
    meshes = {str(p.grad.device_mesh) for p in params if hasattr(p.grad, "device_mesh")}
    if not local and (any(sharded) and not all(sharded) or len(meshes) > 1):  # TP: some grads DTensors
        grads = [
            p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            for p in params
            if p.grad is not None
        ]
        total = torch.nn.utils.get_total_norm(grads)
        coef = torch.clamp(CLIP / (total + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
        return float(total)
    if not local:
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    grads = [
        _local(p.grad) for p in (params if hasattr(params[0], "to_local") else owned) if p.grad is not None
    ]
    norm = torch.nn.utils.get_total_norm(grads)
    coef = torch.clamp(CLIP / (norm + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
    return float(norm)


def micro_batches(
    rows: torch.Tensor, step: int, rank: int, world: int, run: dict[str, Any]
) -> list[dict[str, Any]]:
    """This rank's micro-batches of ``step``: its contiguous share of the global batch, in rank
    order (tensor parallel: every rank the whole batch), cut into ``micro`` pieces."""
    if run["wrap"] == "fsdp2_tp":  # each DP replica (2 of them) its half, its TP ranks the same rows
        world, rank = 2, rank // (world // 2)
    share, at = (ROWS, 0) if run["wrap"] == "tp" else (ROWS // world, rank)
    mine = rows[step * ROWS + at * share : step * ROWS + (at + 1) * share]
    if _on("shuffle_from", run, step):  # a sampler seeded by the rank: each rank its own order
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(rank + 1))
        mine = rows[order[step * share : (step + 1) * share]]
    size = share // run["micro"]
    # sequence parallelism: the embeddings the model sees are the rank's part of the sequence,
    # so the positions (rotary) and the causal mask of the whole sequence are given
    where: dict[str, Any] = {}
    if run["tp_style"] in ("sp", "titan"):
        causal = torch.full((SEQ, SEQ), torch.finfo(torch.float32).min).triu(1)[None, None]
        where = {"position_ids": torch.arange(SEQ)[None], "attention_mask": {"full_attention": causal}}
    return [
        {"input_ids": mine[i : i + size], "labels": mine[i : i + size], **where}
        for i in range(0, share, size)
    ]


def lr_times(optimizer: torch.optim.Optimizer, factor: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] *= factor


def train(out: Path, run: dict[str, Any]) -> None:
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    model = tiny_qwen2()
    step_now = [0]
    plant_faults(model, run, rank == world - 1, step_now)
    ddp = run["wrap"] == "ddp"
    wrapped = wrap(model, run, world)
    plant_grad_fault(model, run, rank == world - 1, step_now)  # on the DTensor weight wrap made
    optimizer = optimizer_of(model, run)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARMUP))
    params = list(model.parameters())
    owned = [p for i, p in enumerate(params) if i % world == rank]  # a shard, for local_norm
    rows = global_rows()
    rec = Recorder(
        out, mode=run["mode"], steps=run["steps"], param_grads=run["param_grads"], golden=run["golden"]
    )
    evidence = StepEvidence(params)
    rec.record_initial_params(model)
    for step in range(run["total"]):
        step_now[0] = step
        micro = micro_batches(rows, step, rank, world, run)
        rec.start(wrapped)
        evidence.begin()
        loss = 0.0
        for i, m in enumerate(micro):
            last_micro = i == len(micro) - 1
            with wrapped.no_sync() if ddp and not last_micro else contextlib.nullcontext():  # type: ignore[operator]
                part = wrapped(**m).loss / len(micro)
                rec.record_output("loss", part)
                wrong = _on("loss_rank_from", run, step) and rank == world - 1
                (part * 2 if wrong else part).backward()
            loss += part.item()
        if run["wrap"] == "zero1" and world > 1:  # ZeRO-1 shards the optimizer only: grads reduced here
            for p in params:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)  # type: ignore[arg-type]
        if run["param_grads"] == "step":
            rec.grads_ready()
        evidence.grads_before_clip(norm=clip(params, owned, _on("local_norm_from", run, step)))
        evidence.grads_after_clip()
        lr_times(optimizer, 0.5 if _on("lr_from", run, step) else 1.0)
        lr, wd = group_settings(optimizer)
        optimizer.step()
        lr_times(optimizer, 2.0 if _on("lr_from", run, step) else 1.0)
        scheduler.step()
        optimizer.zero_grad()
        hashes = batch_hashes(micro)  # the rows in order, and as a set (comparable across DP sizes)
        rec.record_scalars(
            evidence.finish(
                step,
                loss=loss,
                lr=lr,
                weight_decay=wd,
                tokens=token_count(micro),
                batch_hash=hashes[0],
                rows_hash=hashes[1],
                micro_batches=run["micro"],
                skipped=False,
            )
        )
        rec.stop()
        rec.step()
    rec.close()


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:
        dist.init_process_group("gloo")
    try:
        sweep(sys.argv[1:], BASELINE, train, __doc__ or "")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
