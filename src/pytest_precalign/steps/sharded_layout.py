"""The manifest's ``parallel.dtensors`` block: how a rank's model is sharded with DTensors (FSDP2's
``fully_shard``, DTensor tensor parallelism) and how the recording summarised them, for a later
compare that merges the ranks (``precalign compare``) and for the reader of a manifest.

    "dtensors": {
      "fsdp2": {"modules": 3, "mesh": [2], "mesh_dims": [null], "reshard_after_forward": [true],
                "param_dtype": "bfloat16", "reduce_dtype": "float32"},      # or null
      "params": {"count": 24, "mesh": [2], "placements": ["Shard(dim=0)"]},
      "summary": {"stats": "...", "hash": "...", "tensor": "..."}
    }

A model without DTensor parameters and FSDP2 modules has no such block. Where DTensor
parameters are not FSDP2's and their 1-D mesh spans the world (tensor parallelism over every
rank), the layout's ``tp`` is the world and ``dp`` 1 (``tp_layout``): its ranks saw the same
rows, they are not data-parallel replicas.

``check_sharded_recording`` (every ``Recorder.start`` on a model with DTensor parameters): the
DTensors' statistics are combined over the ranks with collectives, so every rank must record
the same step with the same options; one all-gather of (step, recorded, options checksum) per
step finds a rank that differs (``include=``, ``steps=``, ``mode=`` per rank) and raises one
``RecorderError`` on every rank instead of a hang; a rank that never comes is named after at most
``PRECALIGN_RANK_WAIT`` seconds (``rank_agreement.py``: through the store, not a collective).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ConfigError
from ..recording.sharded import is_dtensor
from ..recording.tensor_summary import dtype_name
from .rank_agreement import agree, options_row
from .tp_partials import watch_partials

__all__ = ["check_rank_selection", "check_sharded_recording", "dtensor_block", "tp_layout", "watch_partials"]
from .tp_plan import tp_plan

SUMMARY = {
    "stats": "each rank reads its local shard; max/min/sum/sum of squares/NaN/Inf combined over the "
    "mesh dimensions that shard it at the step's end (Partial placements reduced first): the full "
    "tensor's statistics, the same on every rank",
    "hash": "the full tensor (full_tensor(), gathered over the mesh), hashed on every rank",
    "tensor": "the full tensor (full_tensor(), gathered over the mesh), kept on every rank",
}


def _fsdp2(modules: list[Any]) -> dict[str, Any] | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    fsdp = [m for m in modules if isinstance(m, FSDPModule)]
    if not fsdp:
        return None
    out: dict[str, Any] = {"modules": len(fsdp)}
    reshard: set[bool] = set()
    for module in fsdp:  # torch's private state: read where it is, left out where it is not
        group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
        if group is None:
            continue
        mesh = group.mesh_info.mesh
        out.setdefault("mesh", list(mesh.shape))
        out.setdefault("mesh_dims", list(mesh.mesh_dim_names or [None] * mesh.ndim))
        reshard.add(group.post_forward_mesh_info is not None)
        policy = group.mp_policy
        for key in ("param_dtype", "reduce_dtype"):
            value = getattr(policy, key, None)
            out.setdefault(key, None if value is None else dtype_name(value))
    out["reshard_after_forward"] = sorted(reshard)
    return out


def dtensor_block(chunks: Sequence[torch.nn.Module], prefixes: Sequence[str] = ()) -> dict[str, Any] | None:
    """The ``dtensors`` block of this rank's model chunks (None: no DTensor, no FSDP2), with the
    tensor-parallel plan ``parallelize_module`` left on them (``tp_plan.py``) where there is one."""
    modules = [m for chunk in chunks for m in chunk.modules()]
    params = [p for chunk in chunks for p in chunk.parameters() if is_dtensor(p)]
    fsdp2 = _fsdp2(modules)
    if fsdp2 is None and not params:
        return None
    block: dict[str, Any] = {"fsdp2": fsdp2}
    if params:
        meshes = {tuple(p.device_mesh.shape) for p in params}  # type: ignore[attr-defined]
        block["params"] = {
            "count": len(params),
            "mesh": [list(m) for m in sorted(meshes)] if len(meshes) > 1 else list(next(iter(meshes))),
            "placements": sorted({str(pl) for p in params for pl in p.placements}),  # type: ignore[attr-defined]
        }
    plan = tp_plan(chunks, prefixes)
    if plan:
        block["tp_plan"] = plan
    block["summary"] = SUMMARY
    return block


def tp_layout(block: dict[str, Any], world: int, rank: int) -> dict[str, int] | None:
    """``tp``/``dp`` and their ranks for DTensor tensor parallelism over every rank (see the
    module doc), or over the consecutive ranks of a 2-D mesh's TP dimension (``tp_plan``'s
    groups: ``init_device_mesh(..., (dp, tp))``, tp fastest, the layout's rank order); None
    otherwise."""
    groups = {tuple(e["group"]) for e in block.get("tp_plan", {}).values() if "group" in e}
    if len(groups) == 1:
        group = next(iter(groups))
        tp = len(group)
        if (
            1 < tp <= world
            and world % tp == 0
            and group == tuple(range(rank - rank % tp, rank - rank % tp + tp))
        ):
            return {"tp": tp, "dp": world // tp, "tp_rank": rank % tp, "dp_rank": rank // tp}
    params = block.get("params")
    if block.get("fsdp2") is not None or not params or params["mesh"] != [world] or world < 2:
        return None
    return {"tp": world, "dp": 1, "tp_rank": rank, "dp_rank": 0}


def check_rank_selection(ranks: frozenset[int] | None, mode: str, model: Any) -> None:
    """``Recorder(ranks=...)`` leaving out a rank of a model with DTensor parameters: the
    DTensors' statistics are combined (hashes, tensors gathered) over every rank of their mesh,
    so a rank not recording would leave the others waiting. One ``ConfigError`` on every rank."""
    if ranks is None or mode == "scalars":
        return
    from .model_checks import chunks_of

    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if set(range(world)) <= ranks:
        return
    if any(is_dtensor(p) for chunk in chunks_of(model) for p in chunk.parameters()):
        raise ConfigError(
            f"Recorder: ranks={sorted(ranks)} leaves out ranks of a sharded model (DTensor parameters: "
            "FSDP2, tensor parallelism), whose records are combined over every rank of their mesh; "
            "record every rank (ranks=None) and compare the ranks you want"
        )


def check_sharded_recording(recorder: Any, model: Any) -> None:
    """``check_rank_selection``, then, on a model with DTensor parameters in a process group of
    several ranks, the ranks' agreement on what this step records (``rank_agreement.py``): the
    ``Recorder``'s options, step, whether this rank records it, checked per recording root."""
    ranks, mode = recorder.ranks, recorder.mode
    options = {
        **recorder._options,
        "level": recorder.level,
        "format": recorder.format,
        "params": recorder.params,
    }
    check_rank_selection(ranks, mode, model)
    dist = torch.distributed
    if mode == "scalars" or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    from .model_checks import chunks_of

    if not any(is_dtensor(p) for chunk in chunks_of(model) for p in chunk.parameters()):
        return  # the walk stops at the first DTensor parameter (this runs every step)
    agree(recorder.root, *options_row(options, mode, recorder._step, recorder.selected()))
