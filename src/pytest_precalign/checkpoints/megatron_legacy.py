"""Read a Megatron legacy checkpoint ``iter_*/mp_rank_XX[_YYY]/model_optim_rng.pt`` (TP rank
XX, pipeline rank YYY; no suffix when PP=1) into one full (TP=1, one stage) state dict.

Per pipeline stage, the TP ranks' tensors are merged by ``sharding.param_layout``: sharded
ones gathered (column parallel on dim 0, ``linear_fc1`` de-interleaved from ``[gate_r; up_r]``
per rank to ``[gate; up]``, row parallel on dim 1), replicated ones checked equal on every TP
rank, unknown names refused. Each stage numbers its layers from 0: ``decoder.layers.N``
becomes ``N + the layers of the stages before it``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SourceError
from .sharding import gather_tensor, param_layout
from .trust import CheckpointRefused, allowed_globals, load_pt

if TYPE_CHECKING:
    import torch

FILE = "model_optim_rng.pt"
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


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
    raise SourceError(f"{folder}: expected iter_*/mp_rank_XX[_YYY]/{FILE} (format: megatron)")


def _rank_files(folder: Path) -> list[list[Path]]:
    """``files[pp][tp]``: every rank of a complete TP x PP grid, or one clear error."""
    grid: dict[tuple[int, int], Path] = {}
    for path in sorted(_iteration_dir(folder).glob("mp_rank_*")):
        m = _RANK_DIR.match(path.name)
        if m is None:
            raise SourceError(
                f"{path}: rank folder not understood; allowed: mp_rank_XX (TP rank) or mp_rank_XX_YYY "
                "(TP rank, pipeline rank); expert-parallel checkpoints are not supported (format: megatron)"
            )
        if (path / FILE).is_file():
            grid[(int(m.group(2) or 0), int(m.group(1)))] = path / FILE
    if not grid:
        raise SourceError(f"{folder}: no mp_rank_*/{FILE} found (format: megatron)")
    pp = 1 + max(p for p, _ in grid)
    tp = 1 + max(t for _, t in grid)
    missing = [f"tp {t} pp {p}" for p in range(pp) for t in range(tp) if (p, t) not in grid]
    if missing:
        raise SourceError(
            f"{folder}: incomplete checkpoint: {tp} TP x {pp} PP ranks expected, no {FILE} for "
            f"{', '.join(missing)} (format: megatron)"
        )
    return [[grid[(p, t)] for t in range(tp)] for p in range(pp)]


def _read_rank(path: Path, trust: bool) -> dict[str, torch.Tensor]:
    import torch

    try:
        state = load_pt(path, trust)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt file is bad input, not a crash
        raise SourceError(f"{path}: not a Megatron checkpoint with key 'model' ({exc})") from None
    if not isinstance(state, dict) or "model" not in state:
        chunks = (
            "; virtual-pipeline checkpoints (model0, model1, ...) are not supported"
            if "model0" in (state if isinstance(state, dict) else {})
            else ""
        )
        raise SourceError(f"{path}: not a Megatron checkpoint with key 'model'{chunks}")
    model = state["model"]
    return {k: v for k, v in model.items() if isinstance(v, torch.Tensor) and "_extra_state" not in k}


def check_legacy_pickles(folder: Path) -> None:
    """``refused`` (a SourceError) when a rank file names a class not known to be safe."""
    for stage in _rank_files(folder):
        for path in stage:
            try:
                allowed_globals(path)
            except CheckpointRefused:
                raise
            except Exception:  # noqa: BLE001 - not a torch.save file: the load names it
                continue


def merge_tp(ranks: Sequence[Mapping[str, torch.Tensor]], wheres: Sequence[Path]) -> dict[str, torch.Tensor]:
    """One pipeline stage's TP ranks (in TP order) -> its TP=1 tensors."""
    import torch

    if len(ranks) == 1:
        return dict(ranks[0])
    names = list(ranks[0])
    for rank, where in zip(ranks[1:], wheres[1:], strict=True):
        if set(rank) != set(names):
            odd = sorted(set(rank) ^ set(names))[0]
            raise SourceError(f"{where}: tensor {odd!r} is on some TP ranks of the stage only ({wheres[0]})")
    out: dict[str, torch.Tensor] = {}
    for name in names:
        shards = [rank[name] for rank in ranks]
        layout = param_layout(name, tuple(shards[0].shape))
        if isinstance(layout, str):
            raise SourceError(f"{wheres[0].parent}: {layout}")
        if layout is None:
            for shard, where in zip(shards[1:], wheres[1:], strict=True):
                if shard.shape != shards[0].shape or not torch.equal(shard, shards[0]):
                    raise SourceError(
                        f"{name}: replicated over the TP ranks but differs between {wheres[0]} and {where}"
                    )
            out[name] = shards[0]
        else:
            out[name] = gather_tensor(shards, layout.layout, layout.dim)
    return out


def merge_pp(stages: Sequence[Mapping[str, torch.Tensor]], wheres: Sequence[Path]) -> dict[str, torch.Tensor]:
    """The stages (in order, each numbering its layers from 0) -> one state, global numbers."""
    import torch

    out: dict[str, torch.Tensor] = {}
    offset = 0
    for stage, where in zip(stages, wheres, strict=True):
        count = 0
        for name, tensor in stage.items():
            m = _LAYER.match(name)
            if m:
                count = max(count, int(m.group(1)) + 1)
                name = f"decoder.layers.{offset + int(m.group(1))}.{name[m.end() :]}"
            held = out.get(name)
            if held is not None and (held.shape != tensor.shape or not torch.equal(held, tensor)):
                raise SourceError(f"{where}: {name} is on several pipeline stages with different values")
            out[name] = tensor
        offset += count
    return out


def load_megatron_legacy(folder: Path, trust: bool = False) -> dict[str, torch.Tensor]:
    """The full model state dict of a legacy checkpoint, its TP and PP shards merged; the
    rank files are fully unpickled only when ``trust`` (see ``trust.load_pt``)."""
    if not folder.is_dir():
        raise SourceError(f"{folder}: no such checkpoint folder (format: megatron)")
    grid = _rank_files(folder)
    stages = [merge_tp([_read_rank(path, trust) for path in row], row) for row in grid]
    return merge_pp(stages, [row[0] for row in grid])
