"""Run megatron-core 0.16 on a CPU-only torch (gloo): ``with megatron_cpu(): ...``.

megatron-core assumes CUDA in a few runtime calls on the path of a GPTModel forward and
backward, activation recomputation and the pipeline schedule. Inside ``megatron_cpu()`` each
is answered on the CPU, patched as narrowly as possible, and everything is restored on exit
(also when the body raises). Where CUDA is available it does nothing.

>>> from pytest_precalign import megatron_cpu
>>> with megatron_cpu():
...     losses = get_forward_backward_func()(forward_step_func=step, data_iterator=it, model=[model],
...                                          num_microbatches=1, seq_length=32, micro_batch_size=2)

The workarounds (megatron-core 0.16.1; the only places on these paths):

1. ``torch.cuda.current_device()`` answers ``"cpu"``: ``RotaryEmbedding`` moves ``inv_freq``
   there in every forward, and ``p2p_communication`` allocates the tensors it receives from the
   previous/next pipeline stage on it. (This one is global: it is a function of torch.)
2. The CUDA RNG tracker (``tensor_parallel.random``): the "CUDA" generator is the CPU default
   generator. ``_get_cuda_rng_state``/``_set_cuda_rng_state`` read and set the CPU state, and
   ``torch.cuda.get_rng_state``/``torch.cuda.manual_seed`` as that module sees them do the
   same. So ``model_parallel_cuda_manual_seed(seed)`` works (it reseeds the CPU generator, as
   it reseeds the CUDA one on a GPU), the tracker's ``fork()`` around dropout in
   model-parallel regions swaps CPU states, and activation recomputation
   (``recompute_granularity``, ``CheckpointFunction``) saves and restores them.
3. The pipeline schedule (``pipeline_parallel/schedules.py``) counts tokens in
   ``torch.zeros([], dtype=torch.int, device="cuda")``: as that module sees it, ``torch.zeros``
   puts a ``device="cuda"`` tensor on the CPU.
4. ``pipeline_parallel/p2p_communication.py`` calls ``torch.cuda.synchronize()`` after its
   batched send/recv: as that module sees it, a no-op (gloo's ``wait()`` is synchronous).

Patches 2-4 replace the name ``torch`` inside those three megatron modules only, by a view of
torch that differs in the listed functions; nothing else in torch or megatron changes.
Not handled: Transformer Engine, apex, fused kernels, CUDA graphs, ``enable_autocast``,
Megatron's DistributedDataParallel with overlapped communication (CUDA streams).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

__all__ = ["megatron_cpu"]

_MODULES = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.tensor_parallel.random",
)


class _View:
    """An object (a module) as one megatron module sees it: every attribute is the object's
    own except those in ``overrides``."""

    def __init__(self, target: Any, overrides: dict[str, Any]) -> None:
        self._target = target
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._target, name)

    def __repr__(self) -> str:
        return f"<megatron_cpu view of {self._target!r}>"


def _cpu_device() -> str:
    return "cpu"


def _no_sync(device: Any = None) -> None:
    return None


def _zeros_on_cpu(torch: ModuleType) -> Callable[..., Any]:
    zeros = torch.zeros

    def zeros_cpu(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "cpu"
        return zeros(*args, **kwargs)

    return zeros_cpu


def _rng_functions(torch: ModuleType) -> dict[str, Callable[..., Any]]:
    def get_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> Any:
        return torch.get_rng_state()

    def set_state(new_state: Any, device: Any = -1, graph_safe: bool = False) -> None:
        torch.set_rng_state(new_state)

    def cuda_get_rng_state(device: Any = "cuda") -> Any:
        return torch.get_rng_state()

    def cuda_manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    return {
        "_get_cuda_rng_state": get_state,
        "_set_cuda_rng_state": set_state,
        "get_rng_state": cuda_get_rng_state,
        "manual_seed": cuda_manual_seed,
    }


def _load_modules() -> dict[str, ModuleType]:
    import importlib
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron-core's notices about apex, TE
            return {name: importlib.import_module(name) for name in _MODULES}
    except ImportError as exc:
        from ..errors import SourceError

        raise SourceError(
            f"megatron_cpu needs megatron-core, which is missing ({exc.name}): "
            "pip install 'pytest-precalign[megatron]'"
        ) from None


@contextlib.contextmanager
def _setattr(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


@contextlib.contextmanager
def megatron_cpu() -> Iterator[None]:
    """Answer megatron-core's CUDA assumptions on the CPU for the duration of the block (see the
    module docstring for the list); a no-op where CUDA is available. Nesting is allowed."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    modules = _load_modules()
    schedules, p2p, rng = (modules[name] for name in _MODULES)
    rng_functions = _rng_functions(torch)
    real_torch = sys.modules["torch"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_setattr(torch.cuda, "current_device", _cpu_device))
        cuda_sync = _View(torch.cuda, {"synchronize": _no_sync, "current_device": _cpu_device})
        stack.enter_context(
            _setattr(
                schedules, "torch", _View(real_torch, {"zeros": _zeros_on_cpu(torch), "cuda": cuda_sync})
            )
        )
        stack.enter_context(_setattr(p2p, "torch", _View(real_torch, {"cuda": cuda_sync})))
        cuda_rng = _View(
            torch.cuda,
            {
                "get_rng_state": rng_functions["get_rng_state"],
                "manual_seed": rng_functions["manual_seed"],
                "current_device": _cpu_device,
            },
        )
        stack.enter_context(_setattr(rng, "torch", _View(real_torch, {"cuda": cuda_rng})))
        stack.enter_context(_setattr(rng, "_get_cuda_rng_state", rng_functions["_get_cuda_rng_state"]))
        stack.enter_context(_setattr(rng, "_set_cuda_rng_state", rng_functions["_set_cuda_rng_state"]))
        yield
