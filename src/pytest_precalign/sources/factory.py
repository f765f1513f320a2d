"""``source: factory``: a user function ``"module:function"`` returning an ``nn.Module``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PrecalignError, SourceError
from .imports import import_object, one_line

if TYPE_CHECKING:
    import torch

    from ..config.specs import ModelSpec


def build(spec: ModelSpec, base_dir: Path) -> torch.nn.Module:
    import torch

    path = str(spec.options["factory"])
    what = f"{spec.where}: models.{spec.name}.factory"
    fn = import_object(path, base_dir, what)
    if not callable(fn):
        raise SourceError(f"{what}: {path!r} is not callable")
    kwargs = dict(spec.options.get("kwargs") or {})
    try:
        module = fn(**kwargs)
    except PrecalignError:
        raise
    except Exception as exc:
        raise SourceError(
            f"{what}: {path}(**{kwargs!r}) raised {type(exc).__name__}: {one_line(exc)}"
        ) from None
    if not isinstance(module, torch.nn.Module):
        raise SourceError(f"{what}: {path} returned {type(module).__name__}, expected a torch.nn.Module")
    return module
