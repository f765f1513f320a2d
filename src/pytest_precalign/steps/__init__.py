"""What a training step did and is planned to do: the step evidence, the run's plan and the
case trainers' specs, below the recorders and trainers that use them.

- ``step_evidence``: what one optimizer step did, measured on the live model and optimizer
  (``StepEvidence``; users measure their own loop's scalars with it).
- ``step_norms``: the parameter and update norms, the grads' norm and zero count, each tensor
  read once; ``sharded_norms``: the same of DTensor parameters and grads (FSDP2, tensor
  parallelism), summed over the ranks that shard them.
- ``optimizer_steps``: each optimizer step measured around the torch optimizer's step hooks
  (after the framework's clipping), the plan from the run's own schedulers, written into a
  ``step_sink`` (``StepSink``: the ``Recorder``, or a case trainer's sink).
- ``run_settings``: the settings and plan of a run (the run's own scheduler, put back
  bitwise), as the callbacks and ``Recorder.record_settings`` write them.
- ``spec``: what a case's training does, as frozen specs (optimizer, schedule, clipping,
  weight decay, accumulation, each side's trainer), and what of it a framework cannot express.
- ``trainer_registry``: the case trainers, one line each (the sources each trains and by
  default, launchable, isolation, where grads are taken, its ``run.trainers`` module);
  torch-free, ``config`` validates ``training:`` from it.
- ``layout_probe``: where a rank sits in a parallel run (the manifest's ``parallel`` block),
  read from megatron-core's ``parallel_state``, torch.distributed or the user's ``layout=``.
- ``sharded_layout``: the manifest's ``parallel.dtensors`` block (FSDP2's mesh and settings,
  DTensor placements, how DTensors were summarised); ``tp_plan``: the tensor-parallel plan
  ``parallelize_module`` left on the model, read back from its hooks (``parallel.dtensors.tp_plan``).
  ``rank_agreement``: the ranks' agreement at each ``start()`` on what a sharded model's step
  records, through the process group's store, a rank that never comes named after a bounded wait;
  ``tp_partials``: each rank's partial sum of a ``RowwiseParallel`` output before its all-reduce,
  and its local shards of the Colwise/Rowwise weights' grads.
- ``unwrap``: the model inside a training wrapper (DDP, FSDP, ``torch.compile``, PEFT).
- ``model_checks``: what a model must be to be recorded (``Recorder.start`` checks it before
  adding a hook), and a list of model chunks as one root.

Importing this package does not import torch (``spec`` and ``trainer_registry`` are torch-free).
"""
