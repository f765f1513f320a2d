"""Model sources: turn a ``ModelSpec`` into a ``LoadedModel`` (a module and how to call it).

Each source is a small module with ``build(spec, base_dir) -> torch.nn.Module``, registered in
``config/model_sources.py`` and imported only when a case uses it. ``loading.py`` builds and
calls models, ``imports.py`` imports user code; ``inputs.py`` builds a case's inputs. The
sources: ``hf.py`` (a transformers model class from a config dict, or a local pretrained
folder), ``factory.py`` (a user function returning an ``nn.Module``; with ``runtime: megatron``
the user's own megatron-core model, in the runtime and calling convention of ``megatron.py``),
``megatron.py`` (a megatron-core ``GPTModel`` from a preset).
"""

from __future__ import annotations

from .imports import import_object, importable_from, one_line
from .loading import LoadedModel, apply_patch, build_model, builder, preflight, runtime

__all__ = [
    "LoadedModel",
    "apply_patch",
    "build_model",
    "builder",
    "import_object",
    "importable_from",
    "one_line",
    "preflight",
    "runtime",
]
