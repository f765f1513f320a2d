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

5. The training stack: ``DistributedDataParallel`` allocates its grad buffers (``main_grad``)
   on ``torch.cuda.current_device()`` (patch 1); ``get_megatron_optimizer``'s
   ``FP32Optimizer``, ``Float16OptimizerWithFloat16Params`` (bf16 with fp32 main params) and
   ``ChainedOptimizer`` (``optimizer/optimizer.py``), the ``DistributedOptimizer``
   (``optimizer/distrib_optimizer.py``: its shard buffers), the grad scalers (``grad_scaler.py``),
   ``get_grad_norm_fp32``/``clip_grad_by_total_norm_fp32``/``count_zeros_fp32``
   (``optimizer/clip_grads.py``) and the apex-free ``local_multi_tensor_l2_norm``
   (``megatron/core/utils.py``) create scalars with ``torch.tensor(..., device='cuda')`` or
   ``torch.zeros(..., device='cuda')``: as those modules see torch, such a tensor is made on
   the CPU.
6. ``Float16OptimizerWithFloat16Params`` and ``DistributedOptimizer`` sort parameters by
   ``param.type()`` (one of
   ``'torch.cuda.FloatTensor'``, ``'torch.cuda.BFloat16Tensor'``, ``'torch.cuda.HalfTensor'``)
   and ``clip_grad_by_total_norm_fp32`` asserts ``param.grad.type() == 'torch.cuda.FloatTensor'``:
   called without arguments from those modules of ``megatron.core.optimizer``, a CPU tensor's
   ``type()`` names the CUDA type of its dtype; from anywhere else it answers as always.
   (``OptimizerParamScheduler`` and ``finalize_model_grads`` need nothing.)
7. Mixture of experts (``transformer/moe/moe_utils.py``): in training, the aux-loss tracker
   (``save_to_aux_losses_tracker``) allocates its per-layer values with
   ``torch.zeros(..., device="cuda")``: made on the CPU as in patch 5. The router's gating
   (``router_gating_linear``, megatron-core >= 0.13) tests ``te_general_gemm is not None``, a
   name the module defines only when Transformer Engine imports: where it is missing it is
   None (the plain matmul path) inside the block and removed again on exit.

Patches 2-5 and 7 replace the name ``torch`` inside the listed megatron modules only, by a view of
torch that differs in the listed functions, and only for calls that would fail on a CPU-only
torch (a ``device='cuda'`` argument); nothing else in torch or megatron changes.
Not handled: Transformer Engine, apex, fused kernels, CUDA graphs, ``enable_autocast``,
Megatron's DistributedDataParallel with overlapped communication (CUDA streams), optimizer CPU
offloading, several distributed-optimizer instances. The distributed optimizer's collectives
(``reduce_scatter_tensor`` of the grad buckets inside ``_coalescing_manager``,
``all_gather_into_tensor`` of the updated parameters) run on gloo as they are (torch 2.13).
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
# Modules that make scalars with device='cuda' on the training path (patch 5).
_TRAINING_MODULES = (
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.utils",
    "megatron.core.transformer.moe.moe_utils",
)
# Callers whose ``tensor.type()`` names the CUDA type (patch 6).
_TYPE_CALLERS = frozenset(
    {
        "megatron.core.optimizer.optimizer",
        "megatron.core.optimizer.distrib_optimizer",
        "megatron.core.optimizer.clip_grads",
    }
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


def _on_cpu(factory: Callable[..., Any]) -> Callable[..., Any]:
    """``factory`` (``torch.zeros``, ``torch.tensor``) with ``device='cuda...'`` made on the CPU."""

    def factory_cpu(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return factory_cpu


def _type_as_cuda(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.type`` that, called without arguments from ``_TYPE_CALLERS`` on a CPU tensor,
    answers the CUDA type of its dtype (``'torch.cuda.FloatTensor'``); else ``original``."""

    def type_(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            not args
            and not kwargs
            and self.device.type == "cpu"
            and sys._getframe(1).f_globals.get("__name__") in _TYPE_CALLERS
        ):
            return str(original(self)).replace("torch.", "torch.cuda.", 1)
        return original(self, *args, **kwargs)

    return type_


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
            return {name: importlib.import_module(name) for name in _MODULES + _TRAINING_MODULES}
    except ImportError as exc:
        from ..errors import SourceError

        raise SourceError(
            f"megatron_cpu needs megatron-core, which is missing ({exc.name}): "
            "pip install 'pytest-precalign[megatron]'"
        ) from None


@contextlib.contextmanager
def _setattr(target: Any, name: str, value: Any) -> Iterator[None]:
    """``target.name = value`` for the block; restored after (deleted when it was inherited)."""
    own = name in vars(target)
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        if own:
            setattr(target, name, original)
        else:
            delattr(target, name)


@contextlib.contextmanager
def _define(target: Any, name: str, value: Any) -> Iterator[None]:
    """``target.name = value`` for the block if ``target`` has no ``name``; removed after."""
    if hasattr(target, name):
        yield
        return
    setattr(target, name, value)
    try:
        yield
    finally:
        delattr(target, name)


def _patch_training(stack: contextlib.ExitStack, torch: ModuleType, modules: dict[str, ModuleType]) -> None:
    """Patches 5, 6 and 7: the optimizer, grad scaler, clipping, norm and MoE modules' CUDA
    scalars, ``param.type()`` checks and the router's Transformer Engine gemm."""
    factories = {"tensor": _on_cpu(torch.tensor), "zeros": _on_cpu(torch.zeros)}
    for name in _TRAINING_MODULES:
        module = modules[name]
        cuda = _View(torch.cuda, {"current_device": _cpu_device, "empty_cache": _no_sync})
        stack.enter_context(_setattr(module, "torch", _View(torch, {**factories, "cuda": cuda})))
    stack.enter_context(_setattr(torch.Tensor, "type", _type_as_cuda(torch.Tensor.type)))
    stack.enter_context(_define(modules["megatron.core.transformer.moe.moe_utils"], "te_general_gemm", None))


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
                schedules, "torch", _View(real_torch, {"zeros": _on_cpu(torch.zeros), "cuda": cuda_sync})
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
        _patch_training(stack, torch, modules)
        yield
