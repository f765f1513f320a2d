"""What torch calls back into a ``HookRecorder``: the module pre- and post-forward hooks,
the root's (where a forward starts and ends), the op mode's (level op / mix) and the grad
tensor hooks, each handing its tensors to the capture core (``tensor_capture``).

A forward inside a backward is activation recomputation: its grads are recorded under the
call it repeats. Grads are observed with tensor hooks, which add no autograd nodes; a view's
grad is handed over to its base's node if the view is modified in place (``inplace_grads``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ..trace.records import record_id
from .calls import ModuleCall, _Call
from .forward_guard import in_backward
from .inplace_grads import InPlaceViews
from .ops import PER_MODULE_CALL, api_name
from .tensor_capture import TensorCapture
from .tensor_summary import flatten

# A grad torch hands a tensor hook as None (a compiled backward that computed none for it).
_NO_GRAD = "None: the compiled backward gave no grad for it (not recorded)"


class HookCallbacks(TensorCapture):
    """The hooks of a ``HookRecorder`` (which sets the attributes declared here)."""

    record_inputs: bool
    record_grads: bool
    keep_calls: bool
    calls: list[ModuleCall]
    _modules_on: bool
    _ops_on: bool
    _frames: list[_Call]  # the module calls running now, innermost last
    _op_calls: dict[tuple[str, int, int, str], int]
    _parents: dict[str, str]  # "name#call" -> enclosing module "name#call"
    _recomputed_calls: dict[tuple[str, int], int]
    _stack: dict[int, list[_Call]]
    _hooked_calls: set[tuple[str, int, int]]  # (name, step, call) with grad hooks
    _views: InPlaceViews  # hooked views, in case their memory is modified in place

    def _pre_hook(
        self, name: str, cls: str, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if not self._active:
            return None
        key = (name, self._step)
        # A forward inside a backward is activation recomputation: it repeats call n of the
        # forward (whose tensors are recorded), so only its grads are recorded, as call n's.
        recomputed = in_backward()
        calls = self._recomputed_calls if recomputed else self._calls
        call = calls.get(key, 0)
        calls[key] = call + 1
        inputs: dict[int, int] = {}  # id(tensor) -> seq
        tensors = flatten(args, "in")
        if kwargs:
            tensors += flatten(kwargs, "in")
        if self.record_inputs and self._modules_on and not recomputed:
            for slot, t in tensors:
                inputs[id(t)] = self._capture(t, name, cls, "input", slot, call, (), None)
        grads = self._hooks_grads(name, call, recomputed)
        state = _Call(name, cls, call, self._step, tuple(inputs.values()), [], recomputed, grads)
        self._stack.setdefault(id(module), []).append(state)
        if self._ops_on and not recomputed:
            # A recomputation is not a frame: non-reentrant checkpointing stops it early (its
            # post hooks never run), and its ops are not recorded anyway.
            parent = self._frames[-1] if self._frames else None
            self._parents[f"{name}#{call}"] = f"{parent.name}#{parent.call}" if parent and parent.name else ""
            self._frames.append(state)
        if self.keep_calls and self.step == 0 and not recomputed:
            self.calls.append(ModuleCall(name, call, module, args, dict(kwargs)))
        if grads or not recomputed:
            self._last_call[name] = state
        if grads:
            # A tensor hook observes the input's gradient without adding autograd nodes, so
            # the summation order of the backward (and its bits) stay as they were.
            for slot, t in tensors:
                if t.requires_grad:
                    t.register_hook(self._grad_hook(t, self._grad_input, state, "grad_input", slot))
        return None

    def _hooks_grads(self, name: str, call: int, recomputed: bool) -> bool:
        """Whether this module call gets grad hooks. A recomputation whose forward call had
        them (non-reentrant checkpointing: the backward runs the forward's graph) gets none,
        or each of its input grads would be recorded twice; one whose forward ran without grad
        (reentrant checkpointing: the backward runs the recomputed graph) does."""
        if not (self.record_grads and self._modules_on and torch.is_grad_enabled()):
            return False
        key = (name, self._step, call)
        if recomputed:
            return key not in self._hooked_calls
        self._hooked_calls.add(key)
        return True

    def _post_hook(
        self, name: str, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        stack = self._stack.get(id(module))
        if not stack or not self._active:
            return
        state = stack.pop()
        if self._ops_on:
            if self._frames and self._frames[-1] is state:
                self._frames.pop()
            if not self._modules_on:
                return
        for slot, t in flatten(output, "out"):
            if not state.recomputed:
                self._capture(t, name, state.cls, "activation", slot, state.call, state.input_seqs, None)
            if state.grads and t.requires_grad:
                t.register_hook(self._grad_hook(t, self._grad_output, state, "grad_output", slot))
        if self._live is not None:  # its outputs are judged: inputs not kept are not needed
            self._live.release(state.input_seqs)

    # -- ops (level op / mix) -------------------------------------------------------------
    def _root_enter(self, root: _Call, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self._active and not in_backward():
            self._views.clear()
            if self._ops_on:  # a new forward: frames left by one that raised are not its parents
                self._frames[:] = [root]

    def _root_exit(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self._active:
            return
        if self._frames and self._frames[-1].name == "":
            self._frames.pop()
        if not in_backward():
            self._views.check(t for _, t in flatten(output, "out"))

    def _grad_hook(
        self,
        t: torch.Tensor,
        on_grad: Callable[[_Call, str, torch.Tensor], None],
        state: _Call,
        kind: str,
        slot: str,
    ) -> Callable[[torch.Tensor], None]:
        """The tensor hook that records ``t``'s grad; for a view, one that hands over to its base's
        autograd node if the view is modified in place later (see ``inplace_grads.py``)."""
        deliver = partial(on_grad, state, slot)
        if not t._is_view():  # the common case, without a frame more: run for every hooked tensor
            return deliver
        return self._views.hook(t, deliver, partial(self._refuse_grad, state, kind, slot))

    def _refuse_grad(self, state: _Call, kind: str, slot: str, reason: str) -> None:
        if self._active:
            self._not_recordable[record_id(state.name, kind, slot, state.step, state.call)] = reason

    def _on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not self._frames or self._busy or not self._active or in_backward():
            return  # outside the model's forward (loss, optimizer), the recorder's own work, recomputation
        api = api_name(func)
        if api is None:
            return
        outputs = list(flatten(output, "out"))
        if not outputs:
            return
        parent = self._frames[-1]
        key = (parent.name, parent.call, self._step, api)
        n = self._op_calls.get(key, 0)
        self._op_calls[key] = n + 1
        name = f"{parent.name}.{api}" if parent.name else api
        call = parent.call * PER_MODULE_CALL + n
        self._parents[f"{name}#{call}"] = f"{parent.name}#{parent.call}" if parent.name else ""
        # The op's inputs that were recorded before (by an earlier op or module) are its deps.
        deps: list[int] = []  # seqs
        inputs = set()
        for _, t in (*flatten(args, "in"), *flatten(kwargs, "in")):
            inputs.add(id(t))
            seen = self._seen.get(id(t)) or self._seen.get(id(t._base))  # a view of a recorded tensor
            if seen is not None:
                ref = seen[0]()
                if ref is t or (ref is not None and ref is t._base):
                    deps.append(seen[2])
        state = _Call(name, "api", call, self._step, tuple(deps), [])
        grads = self.record_grads and torch.is_grad_enabled()
        for slot, t in outputs:
            self._capture(t, name, "api", "activation", slot, call, state.input_seqs, None)
            # No hook on an in-place result: its autograd history is about to change hands.
            if grads and t.requires_grad and id(t) not in inputs:
                busy, self._busy = self._busy, True
                try:
                    t.register_hook(self._grad_hook(t, self._grad_output, state, "grad_output", slot))
                finally:
                    self._busy = busy

    def _grad_output(self, state: _Call, slot: str, grad: torch.Tensor | None) -> None:
        if not self._active:  # a backward run after the recorder was closed
            return
        if grad is None:  # torch gives None where a compiled backward computed no grad for it
            self._refuse_grad(state, "grad_output", slot, _NO_GRAD)
            return
        seq = self._capture(grad, state.name, state.cls, "grad_output", slot, state.call, (), state.step)
        state.grad_output_seqs.append(seq)

    def _grad_input(self, state: _Call, slot: str, grad: torch.Tensor | None) -> None:
        if not self._active:
            return
        if grad is None:
            self._refuse_grad(state, "grad_input", slot, _NO_GRAD)
            return
        deps = tuple(state.grad_output_seqs)
        self._capture(grad, state.name, state.cls, "grad_input", slot, state.call, deps, state.step)
