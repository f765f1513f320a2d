"""Each rank's partial sum of a ``RowwiseParallel`` module's output, before torch all-reduces
it: the evidence that names the tensor-parallel rank of a fault in one rank's share.

A row-parallel module's output is all-reduced by the output hook ``parallelize_module`` left on
it, so every rank records the same reduced tensor and a fault in one rank's share shows without
its rank. A forward hook put just before torch's (``Module._forward_hooks`` is ordered) sees the
``Partial`` DTensor; its local tensor's statistics (max, min, sum, norm, float64) are kept per
call in the manifest's ``parallel.dtensors.tp_partials`` (``{module: [[max, min, sum, norm],
...]}``, one list a call; ``null`` for a call with NaN or Inf), on each rank. The hook reads,
never changes, the output; it is removed with the step's other hooks. ``verdict/tp_ranks.py``
compares them rank by rank where a run first diverges at such a module.

The backward's evidence, the same way: each rank's local shard of the grad of a
``ColwiseParallel`` / ``RowwiseParallel`` module's sharded weight (a DTensor grad whose local
tensor is this rank's share of the full grad) is read by a post-accumulate-grad hook on the
parameter, after each accumulation (a micro-batch; on the CPU one read by the C kernels,
``recording/native_kernels.py``: 0.0078 s of CPU a mid step's 80 hooks, 0.064 s with torch's
float64 copy; ``benchmarks/results/sharded.md``): its statistics in
``parallel.dtensors.tp_grad_shards`` (``{param: [[max, min, sum, norm], ...]}``), on each rank.
A grad scaled on one TP rank before the optimizer reads it shows in that rank's shard.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from ..recording import native_kernels
from .tp_plan import output_hook_id


def watch_partials(
    chunks: Sequence[torch.nn.Module], prefixes: Sequence[str], dtensors: Mapping[str, Any] | None
) -> list[RemovableHandle]:
    """Hooks reading the partial sums of this step's ``RowwiseParallel`` modules into the
    ``dtensors`` block (``parallel.dtensors``; its ``tp_plan`` names them); their handles."""
    plan = dtensors.get("tp_plan") if isinstance(dtensors, Mapping) else None
    if not plan or not isinstance(dtensors, dict):
        return []
    found: dict[str, list[list[float] | None]] = {}
    handles: list[RemovableHandle] = []
    for name, module in _planned(chunks, prefixes, plan, ("RowwiseParallel",)):
        theirs = output_hook_id(module)
        if theirs is not None:
            handle = module.register_forward_hook(_reader(found.setdefault(name, [])))
            handles.append(handle)
            hooks: Any = module._forward_hooks  # an OrderedDict: run ours just before torch's output hook
            order = [k for k in hooks if k != handle.id]
            order.insert(order.index(theirs), handle.id)
            for key in order:
                hooks.move_to_end(key)
    if found:
        dtensors["tp_partials"] = found
    return handles + _watch_grad_shards(chunks, prefixes, plan, dtensors)


def _watch_grad_shards(
    chunks: Sequence[torch.nn.Module],
    prefixes: Sequence[str],
    plan: Mapping[str, Any],
    dtensors: dict[str, Any],
) -> list[RemovableHandle]:
    """Hooks reading each rank's local shard of the grads of the sharded weights of this step's
    Colwise/Rowwise modules into ``dtensors["tp_grad_shards"]`` (module doc); their handles."""
    found: dict[str, list[list[float] | None]] = {}
    handles: list[RemovableHandle] = []
    for name, module in _planned(chunks, prefixes, plan, ("ColwiseParallel", "RowwiseParallel")):
        for key, param in module.named_parameters(recurse=False):
            placements = getattr(param, "placements", ())
            if not param.requires_grad or not any(p.is_shard() for p in placements):
                continue
            calls = found.setdefault(f"{name}.{key}", [])
            handles.append(param.register_post_accumulate_grad_hook(_grad_reader(calls)))
    if found:
        dtensors["tp_grad_shards"] = found
    return handles


def _planned(
    chunks: Sequence[torch.nn.Module],
    prefixes: Sequence[str],
    plan: Mapping[str, Any],
    styles: tuple[str, ...],
) -> list[tuple[str, torch.nn.Module]]:
    """The modules of ``chunks`` (each named under its prefix) whose plan entry has one of ``styles``."""
    planned = []
    for i, chunk in enumerate(chunks):
        prefix = prefixes[i] if i < len(prefixes) else ""
        for name, module in chunk.named_modules():
            entry = plan.get(f"{prefix}{name}")
            if isinstance(entry, dict) and entry.get("style") in styles:
                planned.append((f"{prefix}{name}", module))
    return planned


def _grad_reader(calls: list[list[float] | None]) -> Callable[[torch.Tensor], None]:
    def read(param: torch.Tensor) -> None:
        grad = getattr(param.grad, "_local_tensor", None)
        if grad is not None:
            calls.append(_row(grad))

    return read


def _row(local: torch.Tensor) -> list[float] | None:
    """[max, min, sum, norm] of a local tensor, the sums in float64; None where it holds NaN or
    Inf. A CPU tensor's come from one read by the C kernels (no float64 copy, no host read);
    another device's, or where the kernels have none, from torch's reductions on a float64 copy."""
    with torch.no_grad():
        row = native_kernels.stats(local.detach())
        if row is not None:
            return row
        local = local.detach().double()
        values = torch.stack([local.max(), local.min(), local.sum(), local.square().sum().sqrt()])
        row = [float(v) for v in values.tolist()]
    return row if all(v == v and abs(v) != float("inf") for v in row) else None


def _reader(calls: list[list[float] | None]) -> Callable[..., None]:
    def read(module: torch.nn.Module, args: Any, output: Any) -> None:
        placements = getattr(output, "placements", ())
        if not any(p.is_partial() for p in placements):
            return
        calls.append(_row(output._local_tensor))

    return read
