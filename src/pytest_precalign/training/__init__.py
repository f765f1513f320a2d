"""Recording in the user's own training loop, and training runs.

- ``recorder``: the public ``Recorder`` (``pytest_precalign.Recorder``), which drives the hook
  engine (``recording.HookRecorder``) around a user's step and writes ``ROOT/step<N>/rank<R>/``.
  Its two halves: ``recorder_evidence`` (the step's scalars, the initial parameters and the
  run's settings its manifests carry) and ``recorder_writes`` (the root claimed, each step's
  folder written, a write failure reported).
- ``golden``: live compare against a golden run (``Recorder(..., golden=PATH)``): the judge of
  each record and the golden run's reader.
- ``layout_probe``: where a rank sits in a parallel run (the manifest's ``parallel`` block),
  read from megatron-core's ``parallel_state``, torch.distributed or the user's ``layout=``.
- ``megatron_cpu_patch``: ``megatron_cpu()``, megatron-core on a CPU-only torch (gloo).
- ``hf_callback``: ``PrecalignCallback``, recording a ``transformers.Trainer`` run.
- ``run_settings``: the settings and plan of a user's own run (the run's own scheduler, put
  back bitwise), as the callback and ``Recorder.record_settings`` write them.
- ``spec``: what a case's training does, as frozen specs (optimizer, schedule, clipping,
  weight decay, accumulation, each side's trainer), and what of it a framework cannot express.
- ``trainer_registry``: the case trainers, one line each (the sources each trains and by
  default, launchable, isolation, where grads are taken, its ``run.trainers`` module);
  torch-free, ``config`` validates ``training:`` from it.
- ``step_evidence``: what one optimizer step did, measured on the live model and optimizer.
- ``step_norms``: the parameter and update norms, the grads' norm and zero count, each tensor
  read once; ``sharded_norms``: the same of DTensor parameters and grads (FSDP2, tensor
  parallelism), summed over the ranks that shard them.
- ``sharded_layout``: the manifest's ``parallel.dtensors`` block (FSDP2's mesh and settings,
  DTensor placements, how DTensors were summarised); ``tp_plan``: the tensor-parallel plan
  ``parallelize_module`` left on the model, read back from its hooks (``parallel.dtensors.tp_plan``);
  ``rank_agreement``: the ranks' agreement at each ``start()`` on what a sharded model's step
  records, through the process group's store, a rank that never comes named after a bounded wait;
  ``tp_partials``: each rank's partial sum of a ``RowwiseParallel`` output before its all-reduce.
- ``megatron_step``: ``megatron_train_step``, one megatron-core step with its ``StepScalars``.
- ``megatron_stack``: the ``megatron`` trainer (megatron-core's DDP, optimizer, scheduler).
- ``megatron_dp``: data parallelism with megatron-core's distributed optimizer.
- ``model_checks``: what ``Recorder.start`` checks of the model before adding a hook.
- ``run_facts``: the environment and model configuration a ``Recorder`` manifest holds.
- ``unwrap``: the model inside a training wrapper (DDP, FSDP, ``torch.compile``, PEFT).
- ``lightning_callback``: ``PrecalignLightningCallback``, a PyTorch Lightning run recorded.
- ``accelerate_steps``: ``AccelerateSteps``, a custom Accelerate loop recorded.
- ``optimizer_steps``: what both share: each optimizer step measured around the torch
  optimizer's step hooks (after the framework's clipping), the plan from the run's own
  schedulers, written into a ``step_sink`` (``StepSink``: the ``Recorder``, or a case
  trainer's sink).
- ``recorder_options``: the ``Recorder``'s arguments checked; ``run_root``: a root holds one
  run (claimed before the first step; a resumed run continues it).

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
