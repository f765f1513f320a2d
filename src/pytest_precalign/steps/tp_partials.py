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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

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
    for i, chunk in enumerate(chunks):
        prefix = prefixes[i] if i < len(prefixes) else ""
        for name, module in chunk.named_modules():
            entry = plan.get(f"{prefix}{name}")
            theirs = output_hook_id(module) if isinstance(entry, dict) else None
            if theirs is None or entry.get("style") != "RowwiseParallel":
                continue
            handle = module.register_forward_hook(_reader(found.setdefault(f"{prefix}{name}", [])))
            handles.append(handle)
            hooks = module._forward_hooks  # run ours just before torch's output hook
            order = [k for k in hooks if k != handle.id]
            order.insert(order.index(theirs), handle.id)
            for key in order:
                hooks.move_to_end(key)
    if found:
        dtensors["tp_partials"] = found
    return handles


def _reader(calls: list[list[float] | None]) -> Callable[..., None]:
    def read(module: torch.nn.Module, args: Any, output: Any) -> None:
        placements = getattr(output, "placements", ())
        if not any(p.is_partial() for p in placements):
            return
        with torch.no_grad():
            local = output._local_tensor.detach().double()
            values = torch.stack([local.max(), local.min(), local.sum(), local.square().sum().sqrt()])
            row = [float(v) for v in values.tolist()]
        calls.append(row if all(v == v and abs(v) != float("inf") for v in row) else None)

    return read
