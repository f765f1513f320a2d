"""Read an HF ``save_pretrained`` folder (single or sharded safetensors) without writing to it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SourceError
from ..untrusted import check_regular, plain_name, read_json

if TYPE_CHECKING:
    import torch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _shard_files(folder: Path) -> list[Path]:
    index = folder / INDEX
    if index.exists():
        data = read_json(index, SourceError, what="an HF index (JSON)")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise SourceError(
                f"{index}: expected a JSON object with 'weight_map' (tensor name -> shard file)"
            )
        where = f"{index}: weight_map"
        return [plain_name(name, folder, where, SourceError) for name in sorted(set(weight_map.values()))]
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
        try:
            check_regular(path, SourceError, "a safetensors file")
        except FileNotFoundError:
            raise SourceError(f"{path}: shard named in {INDEX} does not exist") from None
        try:
            tensors.update(load_file(str(path)))
        except Exception as exc:  # noqa: BLE001 - a corrupt file is bad input, not a crash
            raise SourceError(f"{path}: not a readable safetensors file ({exc})") from None
    return tensors
