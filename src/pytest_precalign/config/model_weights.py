"""``weights: {load: PATH, format: hf|megatron|megatron-dist, trust: false}`` of a model: its
parameters come from a checkpoint folder instead of its seed (no torch: config uses it).
``trust: true`` lets pickled files in the folder be fully unpickled (``checkpoints/trust.py``);
``trust_checkpoints`` does that for every model (``--trust-checkpoint``).

The folder is relative to the config file. The checkpoint is loaded whole (its own TP/PP
shards merged) into the model, or, for a launched megatron model (``tensor_parallel`` /
``pipeline_parallel`` > 1, ``launch:``), into its TP=1 twin in the parent process, of which
each rank loads its shard (``run/launch.py``): a checkpoint saved at the model's own TP/PP
gives each rank exactly its ``mp_rank`` file's tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..yaml_reader import Reader

if TYPE_CHECKING:
    from .specs import AlignConfig

WEIGHT_FORMATS = ("hf", "megatron", "megatron-dist")
WEIGHTS_KEYS = ("load", "format", "trust")


def parse_model_weights(reader: Reader) -> dict[str, Any] | None:
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
    trust = weights.get_bool("trust", False)
    weights.done()
    return {"load": str(folder), "format": fmt, "trust": trust}


def loads_weights(options: Mapping[str, Any]) -> bool:
    return "weights" in options


def trust_checkpoints(config: AlignConfig) -> AlignConfig:
    """``config`` with every model's checkpoint trusted (the user said ``--trust-checkpoint``)."""
    models = {
        name: replace(spec, options={**spec.options, "weights": {**spec.options["weights"], "trust": True}})
        if loads_weights(spec.options)
        else spec
        for name, spec in config.models.items()
    }
    return replace(config, models=models)
