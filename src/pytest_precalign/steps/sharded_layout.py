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
DTensors' statistics are combined with collectives over the ranks that shard them (the rank's
peers, ``record_peers``), so those ranks must record the same step with the same options; a
row of (step, recorded, options checksum, peers) per step and rank in the process group's store
finds a peer that differs (``include=``, ``steps=``, ``mode=`` per rank) and raises one
``RecorderError`` on each of them instead of a hang; a peer that never comes is named after at
most ``PRECALIGN_RANK_WAIT`` seconds (``rank_agreement.py``: through the store, not a
collective). Ranks that share no shard (another DP replica of a 2-D mesh, another pipeline
stage, a rank that records nothing) are not waited for.
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

__all__ = [
    "check_rank_selection",
    "check_sharded_recording",
    "dtensor_block",
    "record_peers",
    "tp_layout",
    "watch_partials",
]
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


def record_peers(chunks: Sequence[torch.nn.Module]) -> frozenset[int] | None:
    """The global ranks this rank's DTensor records are combined with, itself included: per
    mesh of its DTensor parameters, the ranks of each mesh dimension some parameter is not
    ``Replicate`` on (an FSDP2 mesh, a TP group; an HSDP replicate dimension is left out, its
    replicas are not combined). None without DTensor parameters."""
    dist = torch.distributed
    meshes: dict[int, tuple[Any, set[int]]] = {}
    for chunk in chunks:
        for p in chunk.parameters():
            if not is_dtensor(p):
                continue
            mesh, placements = p.device_mesh, p.placements  # type: ignore[attr-defined]
            dims = meshes.setdefault(id(mesh), (mesh, set()))[1]
            dims.update(d for d, pl in enumerate(placements) if not pl.is_replicate())
    if not meshes:
        return None
    peers = {dist.get_rank()}
    for mesh, dims in meshes.values():
        for dim in dims:
            peers.update(dist.get_process_group_ranks(mesh.get_group(dim)))
    return frozenset(peers)


def check_rank_selection(ranks: frozenset[int] | None, peers: frozenset[int]) -> None:
    """``Recorder(ranks=...)`` that records some of the ranks whose DTensor records are combined
    (``peers``, ``record_peers``) and leaves out others: the recording ranks would wait for the
    others' shards at the step's end. One ``ConfigError`` on each of those ranks."""
    if ranks is None or peers <= ranks or not peers & ranks:
        return
    raise ConfigError(
        f"Recorder: ranks={sorted(ranks)} leaves out ranks {sorted(peers - ranks)} of a sharded model "
        "(DTensor parameters: FSDP2, tensor parallelism) whose shards are combined with those of ranks "
        f"{sorted(peers & ranks)}; record every rank of the mesh that shards them (or none of them), "
        "and compare the ranks you want"
    )


def check_sharded_recording(recorder: Any, model: Any) -> None:
    """On a model with DTensor parameters in a process group of several ranks: the rank
    selection (``check_rank_selection``), then the agreement of this rank and its peers on what
    this step records (``rank_agreement.py``): the ``Recorder``'s options, step, whether this
    rank records it, checked per recording root. A rank ``ranks=`` leaves out records nothing,
    and waits for no one."""
    dist = torch.distributed
    if recorder.mode == "scalars" or not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() == 1:
        return
    from .model_checks import chunks_of

    peers = record_peers(chunks_of(model))
    if peers is None:
        return
    ranks = recorder.ranks
    check_rank_selection(ranks, peers)
    if ranks is not None and dist.get_rank() not in ranks:
        return
    options = {
        **recorder._options,
        "level": recorder.level,
        "format": recorder.format,
        "params": recorder.params,
    }
    row, said = options_row(options, recorder.mode, recorder._step, recorder.selected())
    agree(recorder.root, row, said, peers)
