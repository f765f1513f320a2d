"""Recording in the user's own training loop, and training runs.

- ``recorder``: the public ``Recorder`` (``pytest_precalign.Recorder``), which drives the hook
  engine (``recording.HookRecorder``) around a user's step and writes ``ROOT/step<N>/rank<R>/``.
- ``golden``: live compare against a golden run (``Recorder(..., golden=PATH)``): the judge of
  each record and the golden run's reader.
- ``layout_probe``: where a rank sits in a parallel run (the manifest's ``parallel`` block),
  read from megatron-core's ``parallel_state``, torch.distributed or the user's ``layout=``.
- ``megatron_cpu_patch``: ``megatron_cpu()``, megatron-core on a CPU-only torch (gloo).
- ``lightning_callback``: ``PrecalignLightningCallback``, a PyTorch Lightning run recorded.
- ``accelerate_steps``: ``AccelerateSteps``, a custom Accelerate loop recorded.
- ``optimizer_steps``: what both share: each optimizer step measured around the torch
  optimizer's step hooks (after the framework's clipping), the plan from the run's own
  schedulers.

Importing this package does not import torch; ``Recorder`` is loaded on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .megatron_cpu_patch import megatron_cpu

if TYPE_CHECKING:
    from .recorder import Recorder

__all__ = ["Recorder", "megatron_cpu"]


def __getattr__(name: str) -> Any:
    if name == "Recorder":
        from .recorder import Recorder

        return Recorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
