"""Recording in the user's own training loop: the public recorders.

- ``recorder``: the public ``Recorder`` (``pytest_precalign.Recorder``), which drives the hook
  engine (``recording.HookRecorder``) around a user's step and writes ``ROOT/step<N>/rank<R>/``.
  Its two halves: ``recorder_evidence`` (the step's scalars, the initial parameters and the
  run's settings its manifests carry) and ``recorder_writes`` (the root claimed, each step's
  folder written, a write failure reported).
- ``recorder_options``: the ``Recorder``'s arguments checked; ``run_root``: a root holds one
  run (claimed before the first step; a resumed run continues it); ``resumed_parts``: where a
  callback's run records, kept in the training checkpoint, so a run resumed into a new root
  points to its first part.
- ``golden``: live compare against a golden run (``Recorder(..., golden=PATH)``): the judge of
  each record and the golden run's reader.
- ``run_facts``: the environment and model configuration a ``Recorder`` manifest holds.
- ``hf_callback``: ``PrecalignCallback``, recording a ``transformers.Trainer`` run.
- ``lightning_callback``: ``PrecalignLightningCallback``, a PyTorch Lightning run recorded.
- ``accelerate_steps``: ``AccelerateSteps``, a custom Accelerate loop recorded.

What a step did and is planned to do (the step evidence, the run's settings and plan, the
training specs, the case trainers' registry, where a model sits) is ``steps``'s; megatron-core's
stack is ``megatron_core``'s (``megatron_cpu`` is exported here too, as before).

Importing this package does not import torch; ``Recorder`` is loaded on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..megatron_core.megatron_cpu_patch import megatron_cpu

if TYPE_CHECKING:
    from .recorder import Recorder

__all__ = ["Recorder", "megatron_cpu"]


def __getattr__(name: str) -> Any:
    if name == "Recorder":
        from .recorder import Recorder

        return Recorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
