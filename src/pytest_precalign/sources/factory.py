"""``source: factory``: a user function ``"module:function"`` returning an ``nn.Module``.

With ``runtime: megatron`` the function builds a megatron-core model of its own (a family no
preset builds): the tool sets up what it does for a preset's model, once and in one place
(``sources/megatron.py``): torch.distributed and megatron-core's parallel state around building
and running it (one process: tensor, pipeline and expert parallel size 1), and the CPU
workarounds during its calls. A returned megatron-core module (``MegatronModule``: a
``GPTModel`` or the user's subclass) is called as a preset's ``GPTModel``:
``forward(input_ids, position_ids, attention_mask)`` with the causal mask (True = masked) and
position ids made from the case's inputs; it returns logits ``[b, s, vocab]`` and the loss is the
case's, computed from them as for any model. Its activations stay Megatron's ``[s, b, h]``: the
user's mapping says so (``layouts``), as the preset mappings do. Its steps are trained as a
preset's model's (``config.training.trained_as``): megatron-core's trainer by default.
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PrecalignError, SourceError
from .imports import import_object, one_line

if TYPE_CHECKING:
    import torch

    from ..config.specs import ModelSpec

Caller = Callable[["torch.nn.Module", Mapping[str, Any]], Any]  # LoadedModel.caller


@contextmanager
def _quiet_megatron(spec: ModelSpec) -> Iterator[None]:
    """``runtime: megatron``: megatron-core's warnings at import and construction (apex and
    Transformer Engine absent, deprecated defaults) silenced, as for a preset's model; the
    user's own warnings stay."""
    with warnings.catch_warnings():
        if spec.megatron_core:
            warnings.filterwarnings("ignore", module=r"megatron\.")
        yield


def _function(spec: ModelSpec, base_dir: Path) -> Callable[..., Any]:
    path = str(spec.options["factory"])
    what = f"{spec.where}: models.{spec.name}.factory"
    with _quiet_megatron(spec):
        fn = import_object(path, base_dir, what)
    if not callable(fn):
        raise SourceError(f"{what}: {path!r} is not callable")
    return fn  # type: ignore[no-any-return]


def build(spec: ModelSpec, base_dir: Path) -> torch.nn.Module:
    import torch

    path = str(spec.options["factory"])
    what = f"{spec.where}: models.{spec.name}.factory"
    fn = _function(spec, base_dir)
    kwargs = dict(spec.options.get("kwargs") or {})
    try:
        with _quiet_megatron(spec):
            module = fn(**kwargs)
    except PrecalignError:
        raise
    except Exception as exc:
        raise SourceError(
            f"{what}: {path}(**{kwargs!r}) raised {type(exc).__name__}: {one_line(exc)}{_hint(spec, exc)}"
        ) from None
    if not isinstance(module, torch.nn.Module):
        raise SourceError(f"{what}: {path} returned {type(module).__name__}, expected a torch.nn.Module")
    return module


def _hint(spec: ModelSpec, exc: BaseException) -> str:
    """What to do when megatron-core failed inside the factory for want of the runtime."""
    if spec.megatron_core:
        return ""
    frames = traceback.extract_tb(exc.__traceback__)
    if not any("megatron/core/" in frame.filename.replace("\\", "/") for frame in frames):
        return ""
    return (
        f" (megatron-core raised it: a megatron-core model needs torch.distributed and its parallel "
        f"state, which the tool sets up with 'runtime: megatron' on models.{spec.name})"
    )


def runtime(spec: ModelSpec) -> AbstractContextManager[None]:
    """``runtime: megatron``: the preset source's runtime (torch.distributed and megatron-core's
    parallel state where absent, torn down after the case); nothing otherwise."""
    if not spec.megatron_core:
        return nullcontext()
    from . import megatron

    return megatron.runtime(spec)


def preflight(spec: ModelSpec, base_dir: Path) -> None:
    """``runtime: megatron``: megatron-core installed and the function importable (building
    needs the runtime, so it is not built here); otherwise built on the meta device."""
    if not spec.megatron_core:
        from .loading import build_on_meta

        build_on_meta(spec, base_dir)
        return
    from . import megatron

    megatron.available(f"{spec.where}: models.{spec.name}.runtime: megatron")
    _function(spec, base_dir)


def convention(spec: ModelSpec, module: torch.nn.Module) -> tuple[Caller | None, Callable[[], Any]]:
    """How the built module is called: with ``runtime: megatron``, a megatron-core module as a
    preset's GPTModel and the user's own module around one as ``model(**inputs)``, both inside
    the CPU workarounds; without it, as ``model(**inputs)``."""
    if not spec.megatron_core:
        return None, nullcontext
    from megatron.core.transformer.module import MegatronModule

    from . import megatron

    if not isinstance(module, MegatronModule):  # the user's wrapper: model(**inputs), in context
        return None, megatron.call_context
    return megatron.call, megatron.call_context
