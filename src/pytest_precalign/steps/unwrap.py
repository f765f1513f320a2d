"""The model inside a training wrapper, so that a wrapped run records the names a bare one does.

Users record what their loop holds: ``torch.nn.parallel.DistributedDataParallel`` (every
multi-GPU Trainer / accelerate run), ``DataParallel``, FSDP (``FullyShardedDataParallel``),
megatron-core's ``Float16Module`` and ``DistributedDataParallel`` (MindSpeed's
``module.module.…``), ``torch.compile``'s ``OptimizedModule`` (``_orig_mod``) and PEFT's
``PeftModel`` (``base_model.model``). Their record names would carry the wrapper's prefixes,
and a wrapped run would not pair with a bare one. ``unwrap`` returns the innermost model and
the wrappers it went through (written into the manifest as ``"wrappers"``); hooks on the
inner model see the same calls, since every wrapper's forward calls it.

Wrappers are told by class name and defining package (none of them is imported here).
"""

from __future__ import annotations

from typing import Any

# class name -> (the packages that define it, the attribute path to the wrapped model)
_WRAPPERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "DistributedDataParallel": (("torch.", "megatron."), ("module",)),
    "DataParallel": (("torch.",), ("module",)),
    "FullyShardedDataParallel": (("torch.",), ("_fsdp_wrapped_module",)),
    "Float16Module": (("megatron.",), ("module",)),
    "OptimizedModule": (("torch.",), ("_orig_mod",)),
    "PeftModel": (("peft.",), ("base_model", "model")),
    "PeftModelForCausalLM": (("peft.",), ("base_model", "model")),
}


def _inner(module: Any) -> Any | None:
    cls = type(module)
    known = _WRAPPERS.get(cls.__name__)
    if known is None or not cls.__module__.startswith(known[0]):
        return None
    inner = module
    for attr in known[1]:
        inner = getattr(inner, attr, None)
        if inner is None:
            return None
    return inner


def unwrap(model: Any) -> tuple[Any, tuple[str, ...]]:
    """``(innermost model, wrapper class names outermost first)``; a bare model is its own."""
    seen: list[str] = []
    while True:
        inner = _inner(model)
        if inner is None or inner is model:
            return model, tuple(seen)
        seen.append(f"{type(model).__module__}.{type(model).__qualname__}")
        model = inner


def hooks_before_compile(model: Any, compiled: bool) -> None:
    """Stats mode on a compiled model (``compiled``: the caller knows it is): its in-graph hooks
    are there from its first forward on, also on a step not recorded (dynamo does not see hooks
    added after it traced the model; unrecorded, they add nothing to the graph:
    ``recording/compiled_stats.py``). Model chunks (a list) are not: see docs/limitations.md."""
    if isinstance(model, (list, tuple)):
        return
    from ..recording.compiled import runs_compiled
    from ..recording.compiled_stats import in_graph_stats

    inner, wrappers = unwrap(model)
    if compiled or any(w.endswith(".OptimizedModule") for w in wrappers) or runs_compiled(inner):
        in_graph_stats(inner)
