"""``weights: {load: PATH, format: hf|megatron|megatron-dist}`` of a model: its parameters
come from a checkpoint folder instead of its seed (no torch: config uses it).

The folder is relative to the config file. The checkpoint is loaded whole, so a megatron
model that loads one runs at TP=1, PP=1 (the checkpoint's own TP/PP shards are merged).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..yaml_reader import Reader
from .launch import world_size

WEIGHT_FORMATS = ("hf", "megatron", "megatron-dist")
WEIGHTS_KEYS = ("load", "format")


def parse_model_weights(reader: Reader, options: Mapping[str, Any]) -> dict[str, str] | None:
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
    if world_size(options) != 1 or "launch" in options:
        reader.fail(
            "a model that loads a checkpoint runs at tensor_parallel 1, pipeline_parallel 1, not launched "
            "(the checkpoint's TP/PP shards are merged into the whole model)",
            "weights",
        )
    weights.done()
    return {"load": str(folder), "format": fmt}


def loads_weights(options: Mapping[str, Any]) -> bool:
    return "weights" in options
