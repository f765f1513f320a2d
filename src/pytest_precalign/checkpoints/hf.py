"""Read an HF ``save_pretrained`` folder (single or sharded safetensors) without writing to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SourceError

if TYPE_CHECKING:
    import torch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _shard_files(folder: Path) -> list[Path]:
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"{index}: expected a JSON object with 'weight_map' ({exc})") from None
        return [folder / name for name in sorted(set(weight_map.values()))]
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    raise SourceError(f"{folder}: not an HF checkpoint folder; expected {SINGLE} or {INDEX} (format: hf)")


def load_hf(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder by name; one clear SourceError for a missing or broken file."""
    from safetensors.torch import load_file

    if not folder.is_dir():
        raise SourceError(f"{folder}: no such checkpoint folder (format: hf)")
    tensors: dict[str, torch.Tensor] = {}
    for path in _shard_files(folder):
        if not path.is_file():
            raise SourceError(f"{path}: shard named in {INDEX} does not exist")
        try:
            tensors.update(load_file(str(path)))
        except Exception as exc:  # noqa: BLE001 - a corrupt file is bad input, not a crash
            raise SourceError(f"{path}: not a readable safetensors file ({exc})") from None
    return tensors
