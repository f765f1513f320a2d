"""A checkpoint folder loaded into a built model, strictly: every model tensor (parameters and
persistent buffers; tied parameters count once) gets a checkpoint tensor of its name and
shape, and every checkpoint tensor is used; otherwise one error naming them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SourceError
from .compare import load_checkpoint

if TYPE_CHECKING:
    import torch

_SHOWN = 8


def _named(names: list[str]) -> str:
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _targets(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    import torch

    return {
        name: value
        for name, value in module.state_dict(keep_vars=True).items()
        if isinstance(value, torch.Tensor) and "_extra_state" not in name
    }


def fit_errors(targets: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> list[str]:
    """What keeps ``state`` from filling ``targets`` exactly (empty: it fits)."""
    groups: dict[int, list[str]] = {}
    for name, tensor in targets.items():
        groups.setdefault(id(tensor), []).append(name)
    missing = [names[0] for names in groups.values() if not any(n in state for n in names)]
    unused = [name for name in state if name not in targets]
    shapes = [
        f"{name} {list(state[name].shape)} (model {list(tensor.shape)})"
        for name, tensor in targets.items()
        if name in state and tuple(state[name].shape) != tuple(tensor.shape)
    ]
    out = []
    if missing:
        out.append(f"{len(missing)} model tensor(s) not in the checkpoint: {_named(missing)}")
    if unused:
        out.append(f"{len(unused)} checkpoint tensor(s) the model has no place for: {_named(unused)}")
    if shapes:
        out.append(f"{len(shapes)} shape mismatch(es): {_named(shapes)}")
    return out


def load_into(module: torch.nn.Module, folder: Path, fmt: str, what: str, *, trust: bool = False) -> int:
    """Copy the checkpoint's tensors into ``module`` (cast to each tensor's dtype); returns
    how many were loaded. ``what`` names the config key for messages; ``trust``: the user
    said to trust the checkpoint (its pickles are fully unpickled)."""
    import torch

    state = load_checkpoint(folder, fmt, trust=trust)
    targets = _targets(module)
    errors = fit_errors(targets, state)
    if errors:
        raise SourceError(f"{what}: {folder} (format {fmt}) does not fit the model: {'; '.join(errors)}")
    with torch.no_grad():
        for name, tensor in targets.items():
            if name in state:
                tensor.copy_(state[name])
    return len(state)


def check_trusted(folder: Path, fmt: str, what: str, *, trust: bool = False) -> None:
    """Before anything runs: a checkpoint whose pickles name a class not known to be safe is
    refused now (``SourceError``, a usage error in pytest and exit 2 in the CLI), not when its
    case runs. Read from the pickles' opcodes only; a file that is not readable at all is left
    for the load to name."""
    if trust or fmt == "hf":
        return
    from .megatron_dist import check_dist_metadata
    from .megatron_legacy import check_legacy_pickles

    try:
        (check_legacy_pickles if fmt == "megatron" else check_dist_metadata)(folder)
    except SourceError as exc:
        raise SourceError(f"{what}: {exc}") from None
