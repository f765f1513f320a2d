"""Where a rank sits in a parallel training run: the ``"parallel"`` key of a rank's manifest.

A contract with the merge of rank folders::

    {"tp": 2, "pp": 2, "dp": 1, "cp": 1, "ep": 1, "vpp": null,
     "world_size": 4, "rank": 3, "tp_rank": 1, "pp_rank": 1, "dp_rank": 0, "cp_rank": 0, "ep_rank": 0,
     "order": "tp-cp-ep-dp-pp", "source": "megatron", "sequence_parallel": false,
     "chunks": [{"index": 0, "prefix": "", "layer_offsets": {"decoder.layers": 2}}],
     "sharding": {"decoder.layers.0.self_attention.linear_qkv": "column", ...}}

``source``: ``megatron`` (read from ``megatron.core.parallel_state``), ``torch.distributed``
(only a process group: every rank is a data-parallel replica), ``explicit`` (the user's
``layout=``) or ``single`` (one process). ``layer_offsets``: for each ModuleList of
transformer layers in a chunk (its path inside the chunk), the global 0-based index of its
item 0 (Megatron: ``TransformerLayer.layer_number - 1``; other models: 0). Record names stay
local; a merge renumbers with these offsets. ``sharding``: the record names of Megatron's
sharded modules, by class (``ColumnParallelLinear``, ``RowParallelLinear``,
``VocabParallelEmbedding`` and their subclasses).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..parallel.layout import DEFAULT_ORDER, RANKS, SIZES, check_layout_block

if TYPE_CHECKING:
    import torch

SHARDED_CLASSES = {
    "ColumnParallelLinear": "column",
    "RowParallelLinear": "row",
    "VocabParallelEmbedding": "vocab",
}
_LAYER_SUFFIXES = ("Layer", "Block")


def check_layout(layout: Mapping[str, Any]) -> dict[str, Any]:
    """The user's ``layout=``, validated by the reader's own validator (what records compares)."""
    check_layout_block(layout, "layout", user=True)
    return dict(layout)


def _explicit(layout: Mapping[str, Any], world: int, rank: int) -> dict[str, Any]:
    """The user's layout completed: world size from the sizes, the ``<dim>_rank`` of its rank."""
    parsed = check_layout_block(layout, "layout", user=True)
    rank = int(layout.get("rank", rank))
    coords = {f"{dim}_rank": value for dim, value in parsed.coords(rank).items()}
    return {**_base(parsed.world_size, rank), **coords, **layout, "source": "explicit"}


def process_rank() -> tuple[int, int]:
    """(world size, global rank) of the torch.distributed group, (1, 0) without one."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size()), int(dist.get_rank())
    return 1, 0


def _base(world: int, rank: int) -> dict[str, Any]:
    return {
        **dict.fromkeys(SIZES, 1),
        "vpp": None,
        "world_size": world,
        "rank": rank,
        **dict.fromkeys(RANKS, 0),
        "order": DEFAULT_ORDER,
    }


def _megatron_state() -> Any:
    """megatron.core.parallel_state when the user initialised it (never imported here)."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is not None and ps.model_parallel_is_initialized():
        return ps
    return None


def _megatron_coordinates(ps: Any, world: int, rank: int) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coords: dict[str, Any] = {
            "tp": ps.get_tensor_model_parallel_world_size(),
            "pp": ps.get_pipeline_model_parallel_world_size(),
            "dp": ps.get_data_parallel_world_size(),
            "cp": ps.get_context_parallel_world_size(),
            "ep": ps.get_expert_model_parallel_world_size(),
            "vpp": ps.get_virtual_pipeline_model_parallel_world_size(),
            "world_size": world,
            "rank": rank,
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank(),
            "cp_rank": ps.get_context_parallel_rank(),
            "ep_rank": ps.get_expert_model_parallel_rank(),
        }
    coords["order"] = _order(coords)
    return coords


def _order(c: Mapping[str, Any]) -> str | None:
    """megatron-core does not keep the ``order`` it was initialised with: the supported order
    whose rank formula gives this rank (the default where several do), else None."""
    inner = c["tp_rank"] + c["tp"] * c["cp_rank"]
    candidates = {
        DEFAULT_ORDER: inner + c["tp"] * c["cp"] * (c["dp_rank"] + c["dp"] * c["pp_rank"]),
        "tp-cp-ep-pp-dp": inner + c["tp"] * c["cp"] * (c["pp_rank"] + c["pp"] * c["dp_rank"]),
    }
    return next((order for order, rank in candidates.items() if rank == c["rank"]), None)


def _unwrap(chunk: Any) -> Any:
    while hasattr(chunk, "module") and not hasattr(chunk, "config"):
        chunk = chunk.module  # DDP-style wrappers
    return chunk


def layer_offsets(chunk: torch.nn.Module) -> dict[str, int]:
    """ModuleList path -> global 0-based index of its item 0, for lists of transformer layers."""
    import torch

    offsets = {}
    for path, module in chunk.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or not len(module):
            continue
        first = module[0]
        number = getattr(first, "layer_number", None)
        if isinstance(number, int) and not isinstance(number, bool):
            offsets[path] = number - 1  # Megatron: global and 1-based on every stage
        elif type(first).__name__.endswith(_LAYER_SUFFIXES) and all(type(m) is type(first) for m in module):
            offsets[path] = 0
    return offsets


def sharding(chunks: Sequence[torch.nn.Module], prefixes: Sequence[str]) -> dict[str, str]:
    """Record name -> column | row | vocab, for Megatron's sharded modules (by class)."""
    out = {}
    for chunk, prefix in zip(chunks, prefixes, strict=True):
        for path, module in chunk.named_modules():
            for cls in type(module).__mro__:
                kind = SHARDED_CLASSES.get(cls.__name__)
                if kind is not None:
                    out[prefix + path] = kind
                    break
    return out


def parallel_layout(
    chunks: Sequence[torch.nn.Module], prefixes: Sequence[str], explicit: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The manifest's ``"parallel"`` value for the model chunks of this rank."""
    world, rank = process_rank()
    ps = _megatron_state()
    if explicit is not None:
        layout = _explicit(explicit, world, rank)
    elif ps is not None:
        layout = {**_megatron_coordinates(ps, world, rank), "source": "megatron"}
    elif world > 1 or process_group_exists():
        layout = {**_base(world, rank), "dp": world, "dp_rank": rank, "source": "torch.distributed"}
        from .sharded_layout import dtensor_block, tp_layout  # imports torch

        dtensors = dtensor_block(chunks, prefixes)  # FSDP2, DTensor tensor parallelism (sharded_layout.py)
        if dtensors is not None:
            layout.update({**(tp_layout(dtensors, world, rank) or {}), "dtensors": dtensors})
    else:
        layout = {**_base(1, 0), "source": "single"}
    if "sequence_parallel" not in layout:
        config = getattr(_unwrap(chunks[0]), "config", None) if chunks else None
        layout["sequence_parallel"] = bool(getattr(config, "sequence_parallel", False))
    layout["parallel_output"] = any(bool(getattr(_unwrap(c), "parallel_output", False)) for c in chunks)
    layout["chunks"] = [
        {"index": i, "prefix": prefix, "layer_offsets": layer_offsets(chunk)}
        for i, (chunk, prefix) in enumerate(zip(chunks, prefixes, strict=True))
    ]
    layout["sharding"] = sharding(chunks, prefixes)
    out = {key: layout[key] for key in _KEY_ORDER if key in layout}
    if out.get("order") is None:
        raise ConfigError(
            "Recorder: megatron-core's rank order of this run is neither tp-cp-ep-dp-pp nor "
            "tp-cp-ep-pp-dp; pass layout={...} with its sizes and order"
        )
    check_layout_block(out, "Recorder: parallel")  # what is written can be read back
    return out


_KEY_ORDER = (
    *SIZES,
    "vpp",
    "world_size",
    "rank",
    *RANKS,
    "order",
    "source",
    "sequence_parallel",
    "parallel_output",
    "chunks",
    "sharding",
    "dtensors",
)


def process_group_exists() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())
