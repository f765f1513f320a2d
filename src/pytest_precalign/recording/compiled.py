"""Hooks on a ``torch.compile``'d model. Stats mode computes its statistics inside the compiled
graph (``compiled_stats.py``); the other modes (hash, tensor), the op level and live compare
read real tensors, so their hooks run outside the compiled graph (traced into it, a hash or a
statistic would see fake ones): dynamo breaks the graph at each of them (``SPLITS_GRAPH``);
eager models' hooks are used as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

SPLITS_GRAPH = (
    "the recorder's hooks run outside the compiled graph (mode {mode}, level {level}): dynamo "
    "splits the model's graph at each recorded module, so the recorded step is not the compiled "
    "step that runs unrecorded; stats mode at level module keeps the graph whole"
)


def is_compiled(model: torch.nn.Module) -> bool:
    return type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod")


def runs_compiled(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs under ``torch.compile``: its wrapper (``torch.compile(model)``),
    compiled in place (``model.compile()``), or a LightningModule ``torch.compile`` was given
    to ``Trainer.fit`` (Lightning compiles its steps in place and keeps ``_compiler_ctx``)."""
    return (
        is_compiled(model)
        or getattr(model, "_compiled_call_impl", None) is not None
        or bool(getattr(model, "_compiler_ctx", None))
    )


def compiled_model(model: torch.nn.Module, compiled: bool) -> tuple[torch.nn.Module, bool]:
    """The model to record (the one inside a ``torch.compile`` wrapper: no ``_orig_mod.`` in
    the names) and whether it runs compiled (``compiled``: the caller says so)."""
    if is_compiled(model):
        return cast(torch.nn.Module, model._orig_mod), True
    return model, compiled or runs_compiled(model)


def _as_is(hook: Callable[..., Any]) -> Callable[..., Any]:
    return hook


def _outside_compiled(hook: Callable[..., Any]) -> Callable[..., Any]:
    disabled: Callable[..., Any] = torch.compiler.disable(hook)
    return disabled


def hook_wrapper(
    model: torch.nn.Module, compiled: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What each hook of ``model`` is wrapped in; ``compiled``: the model runs inside a
    ``torch.compile`` wrapper the caller took it out of (``steps.unwrap``)."""
    return _outside_compiled if compiled or runs_compiled(model) else _as_is
