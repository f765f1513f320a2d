"""Read a Megatron legacy checkpoint ``iter_*/mp_rank_XX/model_optim_rng.pt`` (TP=1, PP=1 only)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SourceError

if TYPE_CHECKING:
    import torch

FILE = "model_optim_rng.pt"


def _iteration_dir(folder: Path) -> Path:
    tracker = folder / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        text = tracker.read_text().strip()
        name = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else ""
        if name and (folder / name).is_dir():
            return folder / name
    iters = sorted(p for p in folder.glob("iter_*") if p.is_dir())
    if iters:
        return iters[-1]
    if any(folder.glob("mp_rank_*")):
        return folder
    raise SourceError(f"{folder}: expected iter_*/mp_rank_XX/{FILE} (format: megatron)")


def load_megatron_legacy(folder: Path) -> dict[str, torch.Tensor]:
    """The model state dict of a single-rank legacy checkpoint; several ranks are refused."""
    import torch

    if not folder.is_dir():
        raise SourceError(f"{folder}: no such checkpoint folder (format: megatron)")
    ranks = sorted(p for p in _iteration_dir(folder).glob("mp_rank_*") if (p / FILE).is_file())
    if not ranks:
        raise SourceError(f"{folder}: no mp_rank_*/{FILE} found (format: megatron)")
    if len(ranks) > 1:
        raise SourceError(
            f"{folder}: {len(ranks)} ranks ({ranks[0].name}..{ranks[-1].name}); merging TP/PP shards "
            "is not supported yet: allowed is one mp_rank_00 (TP=1, PP=1)"
        )
    path = ranks[0] / FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        model = state["model"]
    except Exception as exc:  # noqa: BLE001 - a corrupt file is bad input, not a crash
        raise SourceError(f"{path}: not a Megatron checkpoint with key 'model' ({exc})") from None
    return {k: v for k, v in model.items() if isinstance(v, torch.Tensor) and "_extra_state" not in k}
