"""megatron-core's training stack, on our side of it (megatron-core 0.16, CPU and gloo too).

- ``megatron_cpu_patch``: ``megatron_cpu()``, megatron-core on a CPU-only torch (gloo); scoped
  and restored (``pytest_precalign.megatron_cpu``).
- ``megatron_step``: ``megatron_train_step``, one megatron-core step with its ``StepScalars``.
- ``megatron_stack``: the ``megatron`` case trainer's stack (megatron-core's DDP, optimizer,
  scheduler), its plan made before it trains.
- ``megatron_dp``: data parallelism with megatron-core's distributed optimizer.

Importing this package does not import torch or megatron-core.
"""
