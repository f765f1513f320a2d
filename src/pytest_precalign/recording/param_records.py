"""The records of a model's parameters and of their grads, for ``HookRecorder``: a grad as each
backward accumulates it (a post-accumulate grad hook) or once per step (``record_param_grads``),
and each parameter after the optimizer step (``record_params``); named by the model's own
names (``module_names.clean``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..trace.records import Record, record_id
from ..vocabulary import MODES, Kind
from .inplace_grads import InPlaceViews
from .module_names import class_name, clean
from .ops import LEVELS
from .tensor_capture import TensorCapture

if TYPE_CHECKING:
    from .live_golden import Judge


# When parameter grads are recorded: as each backward accumulates them (post-accumulate grad
# hooks), or once per step at ``record_param_grads()``, after the loop reduced them.
PARAM_GRADS = ("backward", "step")


def check_options(mode: str, golden: Judge | None, level: str, param_grads: str) -> None:
    for what, value, allowed in (("record mode", mode, MODES), ("record level", level, LEVELS), ("param_grads", param_grads, PARAM_GRADS)):  # fmt: skip
        if value not in allowed:
            raise ValueError(f"unknown {what} {value!r} (allowed: {', '.join(allowed)})")
    if golden is not None and mode == "tensor":
        raise ValueError("golden= keeps full tensors only where needed: use mode stats or hash")


class ParamRecords(TensorCapture):
    """The explicit records of a ``HookRecorder`` (which has the attributes declared here): the
    parameters', their grads' and the model's output's (``record_output``)."""

    model: torch.nn.Module
    record_grads: bool
    _param_owner: dict[str, tuple[str, str]]
    _grad_calls: dict[tuple[str, int], int]
    _views: InPlaceViews

    def _param_grad_hook(self, pname: str, param: torch.Tensor) -> None:
        if param.grad is not None and self._active:
            self._capture_param_grad(pname, param.grad)

    def record_param_grads(self, micro_batches: int | None = None) -> tuple[int, list[str]]:
        """``param_grads="step"``: record every parameter's grad as the optimizer sees it,
        Megatron's ``main_grad`` where the parameter has one, else ``.grad`` (call after the
        loop's grad reduction, before the optimizer step). One record per parameter and step;
        ``micro_batches``: the grads accumulated over that many micro-batches, recorded as the
        call of the last one (``micro_batches - 1``), as a per-call recording names them.
        Returns how many were recorded and the names of trainable parameters with no grad."""
        found, missing = 0, list[str]()
        if not self.record_grads:
            return found, missing
        for pname, param in self.model.named_parameters():
            pname = clean(pname)
            grad = getattr(param, "main_grad", None)
            grad = param.grad if grad is None else grad
            if param.requires_grad and isinstance(grad, torch.Tensor):
                self._capture_param_grad(pname, grad, None if micro_batches is None else micro_batches - 1)
                found += 1
            elif param.requires_grad:
                missing.append(pname)
        return found, missing

    def _capture_param_grad(self, pname: str, grad: torch.Tensor, call: int | None = None) -> None:
        self._drain_in_graph()  # under compile: the forward's records come first
        owner, cls = self._param_owner.get(pname, ("", class_name(self.model)))
        state = self._last_call.get(owner)
        deps: tuple[int, ...] = ()
        if state is not None:
            deps = (*state.grad_output_seqs, *state.input_seqs)
        if call is None:
            call = self._grad_calls.get((pname, self._step), 0)  # call k: after k + 1 micro-batches
        self._grad_calls[(pname, self._step)] = call + 1
        self._capture(grad, pname, cls, "param_grad", "", call, deps, None)

    def record_params(self) -> None:
        """Record every parameter (call after an optimizer step) as the optimizer steps it:
        Megatron's fp32 ``main_param`` where the parameter has one (a bf16 model under
        ``Float16OptimizerWithFloat16Params``), else the parameter, as grads are recorded."""
        self._drain_in_graph()
        for pname, param in self.model.named_parameters():
            pname = clean(pname)
            main = getattr(param, "main_param", None)
            stepped = main if isinstance(main, torch.Tensor) else param
            owner, cls = self._param_owner.get(pname, ("", class_name(self.model)))
            last = max(self._grad_calls.get((pname, self.step), 1) - 1, 0)
            deps = [record_id(pname, "param_grad", "", self.step, last)]
            if self.step > 0:
                deps.append(record_id(pname, "param", "", self.step - 1, 0))
            self._capture(stepped, pname, cls, "param", "", 0, tuple(deps), None)

    def record_output(
        self, kind: Kind, tensor: torch.Tensor, deps: tuple[str, ...] = (), call: int = 0
    ) -> Record:
        """Record the logits or the loss of the model as a whole (``call``: the micro-batch)."""
        self._views.check([tensor])  # the loss's code may have modified a view in place
        self._drain_in_graph()  # under compile: the forward's records come first
        seq = self._capture(tensor, kind, class_name(self.model), kind, "", call, deps, None)
        return self._record_now(seq)
