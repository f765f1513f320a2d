"""Grads of view tensors whose memory is modified in place after the recorder hooked them.

A tensor hook lives on the tensor's autograd node at the time it is registered. For a plain
tensor modified in place (``h.add_(y)``) that node stays in the graph and the hook fires with
the grad w.r.t. the value before the modification. A *view* is different: the output of
``nn.Linear`` on a 3-d input is a view of the matmul's result, and an in-place op on it
(``ReLU(inplace=True)``, ``h.add_()``, ``x.mul_()`` on a module's input) makes autograd rebase
the history onto its base (a ``CopySlices`` node); the view's old node drops out of the graph
and the hooks on it never fire: the grad_output of the module that made the view and the
grad_input of the modules that took it vanished without a trace.

``InPlaceViews`` watches the views the recorder hooks. At the end of the forward (and when the
logits or the loss are recorded) it looks for views whose base was rebased -- a ``CopySlices``
node in the graph whose first edge is the base's node when the view was hooked, or a version
counter that moved -- and takes their grads from that node instead: a pre-hook on it receives
the grad w.r.t. the base's value at hook time, and the view's elements are read out of it with
the view's geometry. The pre-hook only reads (it returns nothing): no autograd node is added and
the backward's numbers do not change. The view's own hook is then ignored (had the view been
used before the in-place op, it would see that use's grad only). Where the view's elements
cannot be read out of the base's grad (another dtype, a geometry outside the base), the grad is
reported as not recordable, with the reason.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

Deliver = Callable[[torch.Tensor], None]
Refuse = Callable[[str], None]


def _version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # inference tensors have no version counter
        return -1


@dataclass
class _Watched:
    """A hooked view: its base's node and output when hooked, and the view's geometry."""

    ref: weakref.ref[torch.Tensor]
    version: int
    node: Any
    output_nr: int
    base_shape: tuple[int, ...]
    base_stride: tuple[int, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    same_dtype: bool
    deliver: Deliver
    refuse: Refuse
    rebased: bool = False


class InPlaceViews:
    """The views hooked since the current forward began, and the switch to their base's node."""

    def __init__(self) -> None:
        self._watched: list[_Watched] = []
        self._open = 0  # watched views not rebased yet
        self._handles: list[RemovableHandle] = []
        self._scanned: set[Any] = set()  # graph nodes looked at since the forward began
        self._rebased: set[Any] = set()  # and among them, the old nodes of rebased bases

    def hook(self, t: torch.Tensor, deliver: Deliver, refuse: Refuse) -> Deliver:
        """The hook to register on ``t``: ``deliver`` itself for a plain tensor; for a view, one
        that stands down once the view's grad is taken from its base's node."""
        if not t._is_view():
            return deliver
        base = t._base
        node = base.grad_fn if base is not None else None
        if base is None or node is None:
            return deliver
        watched = _Watched(
            weakref.ref(t),
            _version(t),
            node,
            base.output_nr,
            tuple(base.shape),
            tuple(base.stride()),
            tuple(t.shape),
            tuple(t.stride()),
            int(t.storage_offset()) - int(base.storage_offset()),
            t.dtype == base.dtype,
            deliver,
            refuse,
        )
        self._watched.append(watched)
        self._open += 1

        def on_view_grad(grad: torch.Tensor) -> None:
            if not watched.rebased:
                deliver(grad)

        return on_view_grad

    def check(self, roots: Iterable[Any]) -> None:
        """Switch every watched view whose base was rebased to its base's node. ``roots``:
        tensors the graph ends in (the model's outputs, the loss)."""
        if not self._open:
            return
        self._rebased |= _rebased_nodes(roots, self._scanned)
        for w in self._watched:
            if w.rebased:
                continue
            alive = w.ref()
            if w.node in self._rebased or (alive is not None and _version(alive) != w.version):
                w.rebased = True
                self._open -= 1
                self._handles.append(w.node.register_prehook(partial(_from_base, w)))

    def clear(self) -> None:
        """A new forward: the views of the last one are done (their pre-hooks stay on their
        graph, which the next backward does not run)."""
        self._watched.clear()
        self._scanned.clear()
        self._rebased.clear()
        self._open = 0

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.clear()


def _rebased_nodes(roots: Iterable[Any], seen: set[Any]) -> set[Any]:
    """The nodes that are the old history of a base modified in place through a view, among
    the nodes not ``seen`` by an earlier look at this forward's graph (added to ``seen``)."""
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    found: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        edges = node.next_functions
        if type(node).__name__ == "CopySlices" and edges and edges[0][0] is not None:
            found.add(edges[0][0])
        stack.extend(n for n, _ in edges if n is not None and n not in seen)
    return found


def _from_base(w: _Watched, grads: tuple[torch.Tensor | None, ...]) -> None:
    grad = grads[w.output_nr] if w.output_nr < len(grads) else None
    if grad is None:
        return
    reason = _unreadable(w, grad)
    if reason:
        w.refuse(f"not recordable: its view was modified in place and {reason}")
        return
    with torch.no_grad():
        laid_out = torch.empty_strided(w.base_shape, w.base_stride, dtype=grad.dtype, device=grad.device)
        laid_out.copy_(grad)
        w.deliver(laid_out.as_strided(w.shape, w.stride, w.offset))


def _unreadable(w: _Watched, grad: torch.Tensor) -> str:
    if not w.same_dtype:
        return "it has another dtype than its base"
    if tuple(grad.shape) != w.base_shape:
        return "its base's grad has another shape"
    if 0 in w.base_shape or 0 in w.shape:
        return ""
    extent = 1 + sum((n - 1) * s for n, s in zip(w.base_shape, w.base_stride, strict=True))
    last = w.offset + sum((n - 1) * s for n, s in zip(w.shape, w.stride, strict=True))
    if w.offset < 0 or last >= extent or min(w.stride, default=0) < 0:
        return "its elements lie outside its base"
    return ""
