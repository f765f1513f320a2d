"""Record every module of a model with hooks: outputs, inputs, grads, param grads, params.

``HookRecorder`` is a context manager: hooks are added on enter and removed on exit, also when
the forward or backward raises. Recording never changes numerics: tensors are only read
(``detach``), and grads are observed with tensor hooks, which add no autograd nodes.
``grad_input`` is the gradient w.r.t. a module's input tensor as autograd computes it for
that tensor (where the tensor also feeds other code, e.g. a residual, that is included).
A module's forward run again inside the backward (activation recomputation) records nothing
new: its grads are recorded under the call it repeats.

Modes: ``stats`` (max/min/mean/L2 norm/nan/inf counts, computed on the fly), ``tensor``
(a host copy of each tensor, and its stats: kept in the trace, the stats computed by
``trace()``, or handed to ``sink``, a background writer, see ``tensor_sink.py`` and
``kept_tensors.py``), ``hash`` (CRC-32 of the bytes, msprobe's "md5"
field).

One host synchronisation per step: statistics (and, in hash mode, the NaN/Inf evidence)
are computed as device tensors at capture and fetched together when the step ends (``step``
is set to another value, the recorder exits, or ``trace()``), see ``step_buffer.py``. Until
then a record returned by ``capture`` has no ``stats``/``crc32`` yet; ``trace()`` has them.
A CPU tensor's statistics are in host memory as soon as they are computed: stats mode reads
them at capture (none: no host sync at all), its record complete at once.

Live compare (``golden=``, a judge from ``live_compare``): each record is compared with a
golden run's at capture (its statistics fetched at once: one host sync per record) and keeps
its full tensor only where a divergence enters, see ``live_golden.py``.

Under ``torch.compile`` (the wrapper, ``model.compile()``, ``compiled=True``) stats mode takes its
statistics in the compiled graphs, forward and backward (``compiled_stats.py``, ``compiled_grads.py``);
the other modes' hooks run outside the graph, which dynamo splits at each module (one warning).

Levels: ``module`` (the default), ``op`` (torch functions and tensor methods called inside
the modules, see ``ops.py``, instead of the modules' own inputs and outputs) and ``mix``
(both). Op outputs are recorded like module outputs (kind ``activation``, module class
``api``), and the grads w.r.t. them with tensor hooks (kind ``grad_output``).
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, cast

import torch
from torch.utils.hooks import RemovableHandle

from ..trace.records import Record, Trace
from ..trace.training_record import NO_RUN, RunRecord
from .calls import _Call
from .compiled import SPLITS_GRAPH, compiled_model, hook_wrapper
from .compiled_records import CompiledRecords, splits_note
from .forward_guard import ForwardGuard
from .hook_callbacks import HookCallbacks
from .inplace_grads import InPlaceViews
from .live_golden import Judge
from .module_names import class_name, clean, is_wrapper
from .ops import OpMode
from .param_records import ParamRecords, check_options
from .tensor_sink import TensorSink


class HookRecorder(HookCallbacks, ParamRecords):
    """Context manager that records a model's tensors into a ``Trace``.

    >>> with HookRecorder(model, mode="stats") as rec:
    ...     loss = model(x).sum(); loss.backward()
    >>> trace = rec.trace()
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        mode: str = "stats",
        inputs: bool = True,
        grads: bool = True,
        include: tuple[str, ...] = (),
        exclude: tuple[str, ...] = (),
        keep_calls: bool = False,
        level: str = "module",
        param_grads: str = "backward",
        golden: Judge | None = None,
        sink: TensorSink | None = None,
        compiled: bool = False,
        in_graph: bool = True,
        on_raise: Callable[[], None] | None = None,
    ) -> None:
        check_options(mode, golden, level, param_grads)
        model, compiled = compiled_model(model, compiled)  # the model inside a torch.compile wrapper
        super().__init__(mode, golden, sink)
        self.param_grads, self.level = param_grads, level
        self._modules_on = level in ("module", "mix")
        self._ops_on = level in ("op", "mix")
        self._frames = []
        self._op_calls = {}
        self._parents = {}
        self._mode: OpMode | None = None
        self.model = model
        self.record_inputs, self.record_grads, self.include, self.exclude = inputs, grads, include, exclude
        self.keep_calls, self.calls = keep_calls, []
        self._handles: list[RemovableHandle] = []
        self._recomputed_calls = {}
        self._stack = {}
        self._param_owner = {}
        self._grad_calls = {}
        self._hooked_calls = set()
        self._views = InPlaceViews()
        self._guard = ForwardGuard(level, self._ops_on, on_raise, self._make_inert)  # misuse
        self.compiled = compiled  # under torch.compile: stats mode in the graph, others split it
        self._in_graph = in_graph and self.compiled and (mode, level, golden) == ("stats", "module", None)

    # -- lifecycle --------------------------------------------------------------------
    def __enter__(self) -> HookRecorder:
        # A torch.compile'd model: stats mode's hooks are in the graph (``compiled_records``, no
        # module hook here); the other modes' run outside it, on real tensors (traced into it, a
        # hash or a statistic would see fake ones). Eager models: no wrapper.
        eager, graph = hook_wrapper(self.model, self.compiled), self._in_graph
        if self.compiled and not graph:
            warnings.warn(SPLITS_GRAPH.format(mode=self.mode, level=self.level), stacklevel=2)
        try:
            for name, module in self.model.named_modules():
                name = clean(name)  # the model's own names and classes (module_names.py)
                if not name or is_wrapper(module) or not self._selected(name):
                    continue
                cls = class_name(module)
                if not graph:
                    pre = module.register_forward_pre_hook(
                        eager(partial(self._pre_hook, name, cls)), with_kwargs=True
                    )
                    post = module.register_forward_hook(
                        eager(partial(self._post_hook, name)), with_kwargs=True
                    )
                    self._handles += (pre, post)
                for pname, param in module._parameters.items():  # named_parameters(recurse=False), cheaper
                    if param is not None:
                        self._param_owner[f"{name}.{pname}"] = (name, cls)
            # The root is not recorded, but ops in its own forward are (parent ""), and its end
            # is where views modified in place are looked for.
            root = _Call("", class_name(self.model), 0, 0, (), [])
            if not graph:
                self._handles.append(
                    self.model.register_forward_pre_hook(eager(partial(self._root_enter, root)))
                )
                self._handles.append(self.model.register_forward_hook(eager(self._root_exit)))
            if self._ops_on:
                self._mode = OpMode(self._on_op)
                self._mode.start()
            if self.record_grads and self.param_grads == "backward":
                for pname, param in self.model.named_parameters():
                    if param.requires_grad:
                        self._handles.append(
                            param.register_post_accumulate_grad_hook(
                                partial(self._param_grad_hook, clean(pname))
                            )
                        )
            if graph:
                self._graph = CompiledRecords(
                    self.model, self._selected, self.record_inputs, self.record_grads
                )
                self._graph.start()
            else:
                self._handles += self._guard.attach(self.model, eager)  # last: see forward_guard.py
        except BaseException:
            self._remove()
            raise
        self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._flush()
        finally:
            self._remove()

    @property
    def gave_up(self) -> bool:
        """The forward raised and the step could not be given up at once (see forward_guard)."""
        return self._guard.gave_up

    def _remove(self) -> None:
        if self._graph is not None:
            self._graph.stop()
        if self._mode is not None:
            self._mode.stop()
            self._mode = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._views.remove()
        self._active = False

    def _make_inert(self, pop_mode: bool) -> None:
        """Record nothing more (and leave torch's mode stack); the hooks stay until ``__exit__``."""
        self._active = False
        if pop_mode and self._mode is not None:
            self._mode.stop()
            self._mode = None

    def _selected(self, name: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(name, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.exclude)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hooks stay registered but record nothing (e.g. while modules are called again)."""
        self._active = False
        try:
            yield
        finally:
            self._active = True

    # -- result -------------------------------------------------------------------------
    def trace(self, manifest: Mapping[str, Any] | None = None, run: RunRecord = NO_RUN) -> Trace:
        """The records so far as a trace with ``manifest`` (and ``run``, the typed record of
        the run keys that manifest carries)."""
        self._flush()
        built = cast(list[Record], self._records)  # every record is built at a step's end
        self._records[:] = self._kept.fill_stats(built)
        records = tuple(built)
        graph, compiled = self._graph, None
        records = records if graph is None else graph.without_refused(records, self._not_recordable)
        meta = dict(manifest or {})
        meta["record_mode"] = self.mode
        if self._live is not None:
            meta["live"] = self._live.manifest()
            self._live.end_step()
        if self.level != "module":
            meta["record_level"] = self.level
            meta["parents"] = dict(self._parents)
        trace = Trace(manifest=meta, records=records, tensors=dict(self._tensors), run=run)
        if not (self._not_recordable or self.compiled):
            return trace
        if self.compiled:
            compiled = splits_note(self.mode, self.level) if graph is None else graph.note(bool(records))
        return trace.with_notes(not_recordable=dict(self._not_recordable), compiled=compiled)
