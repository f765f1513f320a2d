"""Recording a live model with hooks: what one forward/backward/step produced, as records.

``HookRecorder`` (``recorder``) is the hook engine every entry point drives, in three parts: the
capture core that turns one tensor into a record (``tensor_capture``), the hooks torch calls
(``hook_callbacks``) and the parameters' records (``param_records``): module forward and
backward hooks, parameter-grad hooks, grads read around in-place ops (``inplace_grads``),
op-level capture through a torch function mode (``ops``), and what each record keeps:
statistics, hashes or full tensors (``tensor_summary``, ``kept_tensors``, ``step_buffer``; each
record kept as a draft during its step and built at the step's end by ``record_factory``, a CPU
tensor's statistics read into ``stats_slots`` until then;
a CPU tensor's statistics, zero count and an optimizer step's norms from one read by C kernels
the platform builds: ``native_kernels``; without them, a large CPU tensor's from one read in
cache-sized pieces: ``chunked_stats``; a device tensor's in one compiled kernel: ``fused_stats``),
spilled to disk by a background writer (``tensor_sink``) or compared live against a golden run
(``live_golden``). ``determinism`` sets torch's deterministic switches; ``host_sync`` counts
device-to-host reads; ``compiled`` and ``npu_backend`` adapt to ``torch.compile`` and torch_npu
(under compile, stats mode's statistics are computed in the graph: ``compiled_stats``, the module
outputs' grads in the backward graph: ``compiled_grads``, both by ``in_graph_vector``, turned
into records by ``compiled_records``); ``param_records`` holds the parameters' and their grads' records. ``calls`` holds
the module call being recorded (and isolation's kept calls); ``forward_guard`` the root hooks
that give a step up when its forward raises or runs on another thread. ``param_records``
records the parameters and their grads; ``module_names`` the model's own names and classes
inside wrappers (checkpointing, FSDP2). Tensor subclasses: ``sharded`` keeps every one from
raw-pointer code (a ``DTensor`` read as the full tensor it stands for, others refused), and
``sharded_stats`` combines a stats-mode step's DTensor shards over their mesh at its end.
The user-facing ``Recorder`` for a training loop is in ``training``, built on this engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .recorder import HookRecorder

__all__ = ["HookRecorder"]


def __getattr__(name: str) -> Any:
    if name == "HookRecorder":
        from .recorder import HookRecorder

        return HookRecorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
