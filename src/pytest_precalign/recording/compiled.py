"""Hooks on a ``torch.compile``'d model run outside the compiled graph, on real tensors (traced
into it, a hash or a statistic would see fake ones); eager models' hooks are used as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def is_compiled(model: torch.nn.Module) -> bool:
    return type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod")


def _as_is(hook: Callable[..., Any]) -> Callable[..., Any]:
    return hook


def _outside_compiled(hook: Callable[..., Any]) -> Callable[..., Any]:
    disabled: Callable[..., Any] = torch.compiler.disable(hook)
    return disabled


def hook_wrapper(
    model: torch.nn.Module, compiled: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What each hook of ``model`` is wrapped in; ``compiled``: the model runs inside a
    ``torch.compile`` wrapper the caller took it out of (``training.unwrap``)."""
    return _outside_compiled if compiled or is_compiled(model) else _as_is
