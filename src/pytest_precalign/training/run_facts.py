"""What a ``Recorder`` manifest says about the run besides its records: the environment (as a
case's manifest records it, ``recording.determinism.environment``) and the model's
configuration (a JSON-safe subset of a Hugging Face ``config.to_dict()`` or of megatron-core's
``TransformerConfig`` fields), from which ``precalign compare`` reads a mapping's
``$variables`` (``config.presets.manifest_variables``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from ..recording.determinism import determinism_flags, environment


def run_environment(chunks: Sequence[torch.nn.Module]) -> dict[str, Any]:
    """Versions, platform, device, dtype, seed, determinism, numerics, threads of this run:
    the device and dtype of the model's first parameter (its first floating one for the dtype),
    the seed torch's default generator was last seeded with."""
    params = [p for chunk in chunks for p in chunk.parameters()]
    device = str(params[0].device) if params else "cpu"
    floating = next((p.dtype for p in params if p.is_floating_point()), None)
    dtype = str(floating).removeprefix("torch.") if floating is not None else "none"
    flags = determinism_flags(torch.are_deterministic_algorithms_enabled())
    flags["requested"] = None  # the user's loop sets determinism, not precalign
    return environment(device, dtype, torch.initial_seed(), flags)


def model_config(chunks: Sequence[torch.nn.Module]) -> dict[str, Any] | None:
    """``{"source": "transformers" | "megatron-core", "class": ..., "fields": {...}}`` of the
    first module (outermost first) carrying a ``config``; None when no module has one."""
    for chunk in chunks:
        for module in chunk.modules():
            found = _config_of(getattr(module, "config", None))
            if found is not None:
                source, cls, fields = found
                return {"source": source, "class": cls, "fields": fields}
    return None


def _config_of(config: Any) -> tuple[str, str, dict[str, Any]] | None:
    if config is None:
        return None
    if callable(getattr(config, "to_dict", None)) and not isinstance(config, dict):
        raw = config.to_dict()
        source = "transformers"
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        raw = {f.name: getattr(config, f.name, None) for f in dataclasses.fields(config)}
        source = "megatron-core" if type(config).__module__.startswith("megatron") else "dataclass"
    else:
        return None
    if not isinstance(raw, dict):
        return None
    fields = {str(k): v for k, v in ((k, _json_safe(v)) for k, v in raw.items()) if v is not _SKIP}
    return source, type(config).__name__, fields


_SKIP = object()


def _json_safe(value: Any) -> Any:
    """Numbers, strings, booleans, None, dtypes (as names) and flat lists of them; else _SKIP."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _SKIP
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        items = [_json_safe(v) for v in value]
        return _SKIP if any(v is _SKIP or isinstance(v, list) for v in items) else items
    return _SKIP
