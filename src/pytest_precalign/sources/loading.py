"""Turn a ``ModelSpec`` into a ``LoadedModel`` (a module and how to call it): the source's
builder and runtime, the ``patch:`` hook, and a cheap preflight on the meta device."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.model_sources import SOURCES
from ..errors import CaseError, PrecalignError, SourceError
from .imports import import_object, one_line

if TYPE_CHECKING:
    import torch

    from ..config.specs import ModelSpec


@dataclass(frozen=True)
class LoadedModel:
    name: str
    module: torch.nn.Module
    output: str | None
    caller: Callable[[torch.nn.Module, Mapping[str, Any]], Any] | None = None
    context: Callable[[], AbstractContextManager[Any]] = nullcontext
    cast: str = ""  # what build_model did to its dtypes ("kept: bfloat16 x4, float32 x2", ...)

    def __call__(self, inputs: Mapping[str, Any]) -> Any:
        if self.caller is not None:  # a source with its own calling convention (Megatron)
            return self.caller(self.module, inputs)
        try:
            with self.context():  # nullcontext but for a wrapper around megatron-core modules
                return self.module(**inputs)
        except TypeError as exc:
            text = str(exc)
            if not any(s in text for s in ("unexpected keyword argument", "required positional argument")):
                raise  # an error inside the model's own code: its traceback is the message
            raise CaseError(
                f"model {self.name!r} cannot be called as model(**inputs) with inputs "
                f"{', '.join(sorted(inputs))}: {one_line(exc)} (give it inputs its forward takes, "
                "e.g. an inputs factory, or wrap the model in a factory)"
            ) from None

    def logits(self, output: Any) -> torch.Tensor:
        """The logits of a forward output: ``output:`` key path, else the usual places."""
        import torch

        if self.output:
            value = output
            for part in self.output.split("."):
                value = _get(value, part)
                if value is None:
                    raise SourceError(f"model {self.name!r}: output path {self.output!r} not found")
            if not isinstance(value, torch.Tensor):
                raise SourceError(f"model {self.name!r}: output {self.output!r} is not a tensor")
            return value
        if isinstance(output, torch.Tensor):
            return output
        logits = _get(output, "logits")
        if isinstance(logits, torch.Tensor):
            return logits
        if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
            return output[0]
        raise SourceError(
            f"model {self.name!r}: cannot find logits in its output ({type(output).__name__}); "
            "set 'output:' to the attribute or key that holds them"
        )

    def model_loss(self, output: Any) -> torch.Tensor | None:
        import torch

        loss = _get(output, "loss")
        return loss if isinstance(loss, torch.Tensor) else None


def _get(value: Any, key: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(key)
    if isinstance(value, (tuple, list)) and key.isdigit():
        return value[int(key)] if int(key) < len(value) else None
    return getattr(value, key, None)


def _source_module(source: str) -> Any:
    info = SOURCES.get(source)
    if info is None:
        raise SourceError(f"unknown source {source!r} (allowed: {', '.join(SOURCES)})")
    module_name = info.builder.partition(":")[0]
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'pytest-precalign[{info.extra}]'" if info.extra else str(exc)
        raise SourceError(f"source {source!r} needs a package that is missing ({exc.name}): {hint}") from None


def builder(source: str) -> Callable[[ModelSpec, Path], torch.nn.Module]:
    module = _source_module(source)
    info = SOURCES[source]
    fn: Callable[[ModelSpec, Path], torch.nn.Module] = getattr(module, info.builder.partition(":")[2])
    return fn


def dtype_counts(module: torch.nn.Module) -> str:
    """The floating dtypes of a module's parameters and buffers: ``float32`` when all are, else
    ``bfloat16 x4, float32 x2`` (by count)."""
    counts: dict[str, int] = {}
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            name = str(tensor.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + 1
    if len(counts) <= 1:
        return next(iter(counts), "no floating tensors")
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def runtime(spec: ModelSpec) -> AbstractContextManager[None]:
    """What a source needs around building and running its model (Megatron: torch.distributed)."""
    factory = getattr(_source_module(spec.source), "runtime", None)
    return factory(spec) if factory is not None else nullcontext()


def build_model(spec: ModelSpec, base_dir: Path) -> LoadedModel:
    """Build the module on the spec's device and dtype."""
    from ..recording.determinism import resolve_device, seed_everything, torch_dtype

    device = resolve_device(spec.device)
    seed_everything(spec.seed)
    module = builder(spec.source)(spec, base_dir)
    weights = spec.options.get("weights")
    if weights is not None:  # the user's checkpoint instead of the seed's init (before any patch)
        from ..checkpoints.load_into import load_into

        what = f"{spec.where}: models.{spec.name}.weights"
        load_into(module, Path(weights["load"]), weights["format"], what, trust=bool(weights.get("trust")))
    if spec.patch is not None:
        module = apply_patch(spec, module, base_dir)
    before = dtype_counts(module)
    if spec.dtype == "keep":
        module = module.to(device=device)
        cast = "kept: " + before
    else:
        module = module.to(device=device, dtype=torch_dtype(spec.dtype))
        cast = f"cast to {spec.dtype}" + ("" if before == spec.dtype else f" from {before}")
    source = _source_module(spec.source)
    convention = getattr(source, "convention", None)
    if convention is not None:  # decided per model (a factory's megatron-core module)
        caller, context = convention(spec, module)
    else:
        caller, context = getattr(source, "call", None), getattr(source, "call_context", nullcontext)
    return LoadedModel(
        cast=cast, name=spec.name, module=module, output=spec.output, caller=caller, context=context
    )


def _patch_function(spec: ModelSpec, base_dir: Path) -> Callable[[torch.nn.Module], Any]:
    what = f"{spec.where}: models.{spec.name}.patch"
    fn = import_object(str(spec.patch), base_dir, what)
    if not callable(fn):
        raise SourceError(f"{what}: {spec.patch!r} is not callable")
    return fn  # type: ignore[no-any-return]


def apply_patch(spec: ModelSpec, module: torch.nn.Module, base_dir: Path) -> torch.nn.Module:
    """``patch: "module:function"``: the function gets the built model and returns it (or
    None, having changed it in place) -- how a fault is injected into any source."""
    import torch

    what = f"{spec.where}: models.{spec.name}.patch"
    try:
        result = _patch_function(spec, base_dir)(module)
    except PrecalignError:
        raise
    except Exception as exc:
        raise SourceError(f"{what}: {spec.patch} raised {type(exc).__name__}: {one_line(exc)}") from None
    if result is None:
        return module
    if not isinstance(result, torch.nn.Module):
        raise SourceError(
            f"{what}: {spec.patch} returned {type(result).__name__}, expected the model or None"
        )
    return result


def preflight(spec: ModelSpec, base_dir: Path) -> None:
    """Check that a model can be built, cheaply: on the meta device (no memory, no init).

    A source whose construction does not work on meta (data-dependent init) is retried for
    real on the CPU; only a failure there is reported.
    """
    from ..recording.determinism import resolve_device

    resolve_device(spec.device)
    if spec.patch is not None:
        _patch_function(spec, base_dir)
    custom = getattr(_source_module(spec.source), "preflight", None)
    if custom is not None:
        custom(spec, base_dir)
        return
    build_on_meta(spec, base_dir)


def build_on_meta(spec: ModelSpec, base_dir: Path) -> None:
    """Build the model on the meta device; where its construction does not work there, for
    real on the CPU, reporting only a failure of that."""
    import torch

    build = builder(spec.source)
    try:
        with torch.device("meta"):
            build(spec, base_dir)
        return
    except Exception:  # noqa: BLE001 - retried for real below, where the error is reported
        pass
    build(spec, base_dir)
