"""What ``Recorder.start`` checks of the model it is given, before adding a hook: one
``RecorderError`` each, instead of a raw error mid-step or a step of silent zeros."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..errors import RecorderError

# msprobe's dump names become file names (dump_tensor_data/<api>.<module>....pt)
_NOT_IN_FILE_NAMES = ("/", "\\", "\0")


class ChunksRoot(torch.nn.Module):
    """Model chunks (virtual pipeline) under one root: their records are ``chunk<k>.<name>``.
    Holding the chunks does not change them; the root itself is never called."""

    def __init__(self, chunks: Sequence[torch.nn.Module]) -> None:
        super().__init__()
        for k, chunk in enumerate(chunks):
            self.add_module(f"chunk{k}", chunk)


def chunks_of(model: Any) -> list[torch.nn.Module]:
    """The model chunks ``start`` was given: an nn.Module, or a non-empty list of them."""
    if isinstance(model, torch.nn.Module):
        return [model]
    chunks = list(model) if isinstance(model, Iterable) and not isinstance(model, (str, bytes)) else None
    if not chunks or not all(isinstance(c, torch.nn.Module) for c in chunks):
        got = "an empty list" if chunks == [] else _describe(model)
        raise RecorderError(
            f"Recorder.start: expected an nn.Module or a non-empty list of nn.Module chunks, got {got}"
        )
    return chunks


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value if not isinstance(v, torch.nn.Module)})
        return f"a {type(value).__name__} holding {', '.join(kinds)}"
    name = getattr(value, "__qualname__", None)
    kind = type(value).__name__
    return f"{kind} {name!r}" if isinstance(name, str) else kind


def check_recordable(model: torch.nn.Module, fmt: str) -> None:
    """A model whose tensors hold values (not on the meta device) and, for msprobe's format,
    whose module names can be file names."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if tensor.is_meta:
            raise RecorderError(
                f"Recorder.start: the model's {name} is on the meta device: it holds no values to record "
                "(materialize the model first, e.g. to_empty(device=...) and load its weights)"
            )
    if fmt != "msprobe":
        return
    for name, _ in model.named_modules():
        if any(c in name for c in _NOT_IN_FILE_NAMES):
            raise RecorderError(
                f"Recorder.start: module {name!r} cannot be stored in msprobe's format (its names become "
                "file names: no '/', '\\\\' or NUL); use format='native' or rename the module"
            )
