"""``weights: {load: PATH, format: hf|megatron|megatron-dist}`` of a model: its parameters
come from a checkpoint folder instead of its seed (no torch: config uses it).

The folder is relative to the config file. The checkpoint is loaded whole (its own TP/PP
shards merged) into the model, or, for a launched megatron model (``tensor_parallel`` /
``pipeline_parallel`` > 1, ``launch:``), into its TP=1 twin in the parent process, of which
each rank loads its shard (``run/launch.py``): a checkpoint saved at the model's own TP/PP
gives each rank exactly its ``mp_rank`` file's tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..yaml_reader import Reader

WEIGHT_FORMATS = ("hf", "megatron", "megatron-dist")
WEIGHTS_KEYS = ("load", "format")


def parse_model_weights(reader: Reader) -> dict[str, str] | None:
    """The model's ``weights:`` (the folder made absolute), or None when it has none."""
    weights = reader.get_mapping("weights")
    if weights is None:
        return None
    weights.check_keys(WEIGHTS_KEYS)
    load = weights.get_str("load", required=True)
    fmt = weights.get_choice("format", WEIGHT_FORMATS, None)
    if fmt is None:
        weights.fail(f"missing required key 'format' (allowed: {', '.join(WEIGHT_FORMATS)})")
    folder = Path(load) if Path(load).is_absolute() else Path(reader.source).parent / load
    if not folder.is_dir():
        weights.fail(f"no such checkpoint folder {str(folder)!r}", "load")
    weights.done()
    return {"load": str(folder), "format": fmt}


def loads_weights(options: Mapping[str, Any]) -> bool:
    return "weights" in options
