"""The names and classes a recorder gives a model's modules and parameters: those of the model as
its author wrote it, whatever wraps its pieces.

- Wrappers that hold a module as a child (``checkpoint_wrapper``'s ``_checkpoint_wrapped_module``,
  FSDP1's ``_fsdp_wrapped_module``, ``torch.compile`` of a submodule: ``_orig_mod``) add a path
  segment to every name inside them: the segment is dropped (``clean``), and the wrapper itself
  is not recorded (``is_wrapper``): its forward is the inner module's, recorded under the same
  name.
- FSDP2's ``fully_shard`` swaps a module's class for ``FSDP<Class>`` (a subclass of
  ``FSDPModule`` and the class): the class recorded is the module's own (``class_name``).

So an FSDP2 / checkpointed / partly compiled run's records pair with a bare run's by name and
class. A wrapper given to the recorder as the model itself (DDP's ``module.``) is taken off
before (``steps/unwrap.py``)."""

from __future__ import annotations

from typing import Any

WRAPPED = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod")
_SEGMENTS = tuple(f"{w}." for w in WRAPPED)


def clean(name: str) -> str:
    """``name`` without the wrappers' path segments."""
    if "_" not in name or not any(w in name for w in WRAPPED):
        return name
    parts = [p for p in name.split(".") if p not in WRAPPED]
    return ".".join(parts)


def is_wrapper(module: Any) -> bool:
    """Whether ``module`` only wraps a child under one of ``WRAPPED`` (not recorded itself)."""
    children = getattr(module, "_modules", None)
    return isinstance(children, dict) and any(w in children for w in WRAPPED)


def class_name(module: Any) -> str:
    """The module's class name, FSDP2's ``FSDP<Class>`` as ``<Class>``."""
    cls = type(module)
    if cls.__name__.startswith("FSDP"):
        bases = [b for b in cls.__bases__ if b.__name__ != "FSDPModule"]
        if len(bases) < len(cls.__bases__) and bases:
            return bases[0].__name__
    return cls.__name__
