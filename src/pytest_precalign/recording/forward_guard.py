"""Two hooks on the model's root that keep a recording step honest when it is misused:

- a forward that raises gives the step up at once (``on_raise``: the public ``Recorder``
  removes the hooks, pops the op mode, stops the writer thread and deletes its temporary
  folder), seen by a forward hook torch runs also when the forward raises (``always_call``);
- at level op/mix, a forward on another thread than the one that started recording is refused:
  torch's function modes are per thread, so its ops would silently not be recorded.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from ..errors import RecorderError


def in_backward() -> bool:
    """Whether autograd is running a backward pass in this thread now."""
    return bool(torch._C._current_graph_task_id() != -1)


class ForwardGuard:
    def __init__(
        self,
        level: str,
        thread_bound: bool,
        on_raise: Callable[[], None] | None,
        make_inert: Callable[[bool], None],
    ) -> None:
        self.level = level
        self.thread_bound = thread_bound  # level op/mix: ops are seen on this thread only
        self.on_raise = on_raise
        self.make_inert = make_inert
        self.thread = threading.get_ident()
        self.outer: BaseException | None = None
        self.handle: RemovableHandle | None = None
        self.gave_up = False  # the step was given up without ``on_raise`` (see ``raised``)

    def attach(
        self, model: torch.nn.Module, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> list[RemovableHandle]:
        """Register the hooks (each in ``wrap``: ``compiled.hook_wrapper``); call it last, after
        every other hook on ``model`` (see ``raised``)."""
        pre = model.register_forward_pre_hook(wrap(self.entered))
        self.handle = model.register_forward_hook(wrap(self.raised), always_call=True)
        return [pre, self.handle]

    def entered(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        # The exception being handled where the forward is called: a forward run inside an
        # ``except`` block is not one that raised.
        self.outer = sys.exc_info()[1]
        if self.thread_bound and threading.get_ident() != self.thread and not in_backward():
            raise RecorderError(
                f"Recorder at level '{self.level}': the forward ran on thread "
                f"{threading.current_thread().name!r}, but torch calls are seen only on the thread "
                "that called start() (torch's function modes are per thread); call start() on the "
                "thread that runs the forward, or record at level 'module'"
            )

    def raised(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """Torch runs this also when the forward raised, iterating the root's forward hooks:
        this one is the last of them, so ``on_raise`` may remove them. If the user added one
        after it, or the forward ran on another thread (whose mode stack is not the one the op
        mode is on), the hooks are only made inert and the step marked given up: the next
        ``stop``/``start``/``close`` removes them."""
        exc = sys.exc_info()[1]
        if exc is None or exc is self.outer or self.on_raise is None:
            return
        elsewhere = threading.get_ident() != self.thread
        if elsewhere or self.handle is None or next(reversed(module._forward_hooks), None) != self.handle.id:
            self.gave_up = True
            self.make_inert(not elsewhere)
            return
        on_raise, self.on_raise = self.on_raise, None
        on_raise()
