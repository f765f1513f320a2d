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
statistics in the compiled graph, module grads listed as not recordable (``compiled_stats.py``);
the other modes' hooks run outside the graph, which dynamo splits at each module (one warning).

Levels: ``module`` (the default), ``op`` (torch functions and tensor methods called inside
the modules, see ``ops.py``, instead of the modules' own inputs and outputs) and ``mix``
(both). Op outputs are recorded like module outputs (kind ``activation``, module class
``api``), and the grads w.r.t. them with tensor hooks (kind ``grad_output``).
"""

from __future__ import annotations

import fnmatch
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, cast

import torch
from torch.utils.hooks import RemovableHandle

from ..trace.records import Record, Stats, Trace, record_id
from ..vocabulary import Kind
from . import step_buffer
from .calls import ModuleCall, _Call
from .compiled import SPLITS_GRAPH, compiled_model, hook_wrapper
from .compiled_records import CompiledRecords, splits_note
from .forward_guard import ForwardGuard, in_backward
from .inplace_grads import InPlaceViews
from .kept_tensors import KeptTensors
from .live_golden import Judge, LiveKeeper
from .module_names import class_name, clean, is_wrapper
from .ops import PER_MODULE_CALL, OpMode, api_name
from .param_records import ParamRecords, check_options
from .record_factory import Draft, build_drafts, record_now
from .sharded import is_dtensor, plain
from .sharded_stats import ShardedStats
from .stats_slots import StatsSlots
from .step_buffer import StepBuffer
from .tensor_sink import TensorSink
from .tensor_summary import flatten, summarisable

# A grad torch hands a tensor hook as None (a compiled backward that computed none for it).
_NO_GRAD = "None: the compiled backward gave no grad for it (not recorded)"


class HookRecorder(ParamRecords):
    """Context manager that records a model's tensors into a ``Trace``.

    >>> with HookRecorder(model, mode="stats") as rec:
    ...     loss = model(x).sum(); loss.backward()
    >>> trace = rec.trace()
    """

    _graph: CompiledRecords | None = None  # under torch.compile, stats mode: set at enter

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
        self.param_grads, self.level = param_grads, level
        self._modules_on = level in ("module", "mix")
        self._ops_on = level in ("op", "mix")
        self._frames: list[_Call] = []  # the module calls running now, innermost last
        self._op_calls: dict[tuple[str, int, int, str], int] = {}
        self._parents: dict[str, str] = {}  # "name#call" -> enclosing module "name#call"
        self._busy = False  # the recorder's own torch calls are not ops of the model
        self._mode: OpMode | None = None
        self.model, self.mode = model, mode
        self.record_inputs, self.record_grads, self.include, self.exclude = inputs, grads, include, exclude
        self._buffer = StepBuffer()  # this step's statistics / hashes, fetched at its end
        self._pending: dict[int, tuple[int | None, int | None]] = {}  # seq -> (stats, crc) handles
        self._step, self.keep_calls, self.calls = 0, keep_calls, list[ModuleCall]()
        self._records: list[Record | Draft] = []  # by seq; a Draft until its step ends (``_flush``)
        self._built = 0  # the records before this seq are Records
        self._tensors: dict[str, torch.Tensor] = {}
        self._kept = KeptTensors(self._tensors, sink)  # tensor mode: in the trace, or to ``sink``
        self._handles: list[RemovableHandle] = []
        self._calls: dict[tuple[str, int], int] = {}
        self._recomputed_calls: dict[tuple[str, int], int] = {}
        self._stack: dict[int, list[_Call]] = {}
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, int]] = {}  # id -> (ref, version, seq)
        self._param_owner: dict[str, tuple[str, str]] = {}
        self._last_call: dict[str, _Call] = {}
        self._grad_calls: dict[tuple[str, int], int] = {}  # grads accumulated per micro-batch
        self._hooked_calls: set[tuple[str, int, int]] = set()  # (name, step, call) with grad hooks
        self._views = InPlaceViews()  # hooked views, in case their memory is modified in place
        self._not_recordable: dict[str, str] = {}  # record id -> why its grad cannot be recorded
        # Stats mode: a CPU tensor's statistics read at capture into a slot (``stats_slots.py``);
        # a DTensor's local shard's, combined over its mesh at the step's end (``sharded_stats.py``).
        self._slots = StatsSlots() if mode == "stats" and golden is None else None
        self._read_cpu = None if self._slots is None else self._slots.read
        self._sharded = None if self._slots is None else ShardedStats()
        self._at_capture = step_buffer.read_at_capture
        self._active = False
        self._guard = ForwardGuard(level, self._ops_on, on_raise, self._make_inert)  # misuse
        built = cast(list[Record], self._records)  # live compare: see live_golden.py
        self._live = None if golden is None else LiveKeeper(golden, built, self._tensors)
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

    @property
    def step(self) -> int:
        """The step being recorded; setting another value ends the step (one host sync)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        if value != self._step:
            self._flush()
            if self._live is not None:
                self._live.end_step()
        self._step = value

    def _flush(self) -> None:
        """The step's end: the pending statistics and CRCs (one host sync per device), and the
        ``Record`` of each draft, built in one loop (``record_factory.build_drafts``)."""
        self._drain_in_graph()
        pending, self._pending = self._pending, {}
        fetched: dict[int, tuple[Stats | None, str | None]] = {}
        if self._graph is not None:  # one host sync per device
            fetched.update(self._graph.fetch(self._records))
        if pending:
            stats, crcs = self._buffer.flush()
            for seq, (sh, ch) in pending.items():  # hash mode: no stats unless NaN/Inf evidence
                fetched[seq] = (None if sh is None else stats[sh], None if ch is None else crcs[ch])
        if self._sharded is not None:
            fetched.update(self._sharded.combine(self._step))
        slots = self._slots
        build_drafts(self._records, self._built, fetched, None if slots is None else slots.stats)
        self._built = len(self._records)
        if slots is not None:
            slots.clear()

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

    # -- capture ----------------------------------------------------------------------
    def capture(
        self,
        tensor: torch.Tensor,
        *,
        name: str,
        module_class: str,
        kind: Kind,
        slot: str,
        call: int = 0,
        deps: tuple[str, ...] = (),
        step: int | None = None,
    ) -> Record:
        """Record one tensor (an identical tensor object seen before is not read again); its
        ``Record`` as known now (statistics fetched at the step's end are not in it yet)."""
        self._drain_in_graph()  # under compile: the forward's records come first
        return self._record_now(self._capture(tensor, name, module_class, kind, slot, call, deps, step))

    def _capture(
        self,
        tensor: torch.Tensor,
        name: str,
        module_class: str,
        kind: Kind,
        slot: str,
        call: int,
        deps: tuple[str | int, ...],
        step: int | None,
    ) -> int:
        """``capture``, its record kept as a draft until the step ends: its seq."""
        step = self._step if step is None else step
        records = self._records
        seq = len(records)
        summary: int | Stats | None
        try:
            version = tensor._version
        except RuntimeError:  # inference tensors have no version counter
            version = -1
        seen = self._seen.get(id(tensor))
        same_as: int | None = None
        if seen is not None and seen[0]() is tensor and seen[1] == version:
            same_as = seen[2]
            earlier = records[same_as]
            if isinstance(earlier, Record):
                summary, crc, key = earlier.stats, earlier.crc32, earlier.tensor_key
            else:
                summary, crc, key = earlier[9:]
            self._share_pending(seq, same_as)
        else:
            busy, self._busy = self._busy, True
            try:
                data = self._readable(tensor, seq, name, kind, slot, step, call)
                if data is None:
                    summary, crc, key = None, None, None
                elif self._read_cpu is not None and self._at_capture(data):
                    summary, crc, key = self._read_cpu(data), None, None
                else:
                    rid = record_id(name, kind, slot, step, call) if self._live is not None else ""
                    summary, crc, key = self._summarize(data.detach(), seq, rid)
            finally:
                self._busy = busy
        records.append(
            (name, module_class, kind, step, call, slot, tensor.dtype, tensor.shape, deps, summary, crc, key)
        )
        self._seen[id(tensor)] = (weakref.ref(tensor), version, seq)
        if self._live is not None:
            self._decide_live(seq, tensor, same_as)
        return seq

    def _decide_live(self, seq: int, tensor: torch.Tensor, same_as: int | None) -> None:
        """Live compare judges record ``seq`` now (may keep its tensor: a subclass as the plain
        tensor it stands for, a DTensor gathered again)."""
        assert self._live is not None
        record = self._records[seq] = self._record_now(seq)
        busy, self._busy = self._busy, True
        try:
            self._live.decide(seq, tensor if plain(tensor) else summarisable(tensor, record.id), same_as)
        finally:
            self._busy = busy

    def _share_pending(self, seq: int, same_as: int) -> None:
        """Record ``seq`` is tensor ``same_as`` read again: it gets that one's pending values."""
        if same_as in self._pending:
            self._pending[seq] = self._pending[same_as]
        if self._sharded is not None and same_as in self._sharded:
            self._sharded.alias(seq, same_as)

    def _readable(
        self, tensor: torch.Tensor, seq: int, name: str, kind: Kind, slot: str, step: int, call: int
    ) -> torch.Tensor | None:
        """The tensor to summarise: a plain dense one as it is; a sparse, meta or nested tensor
        or a tensor subclass as ``summarisable`` makes it (a DTensor's full tensor, gathered);
        None for a DTensor in stats mode, whose local shard is read now and whose ``Stats`` are
        combined over its mesh at the step's end (``sharded_stats.py``)."""
        if plain(tensor) and tensor.layout is torch.strided and not tensor.is_meta and not tensor.is_nested:
            return tensor
        rid = record_id(name, kind, slot, step, call)
        if self._sharded is not None and not tensor.is_meta and is_dtensor(tensor):
            self._sharded.add(seq, tensor, rid)
            return None
        return summarisable(tensor, rid)

    def _record_now(self, seq: int) -> Record:
        """Record ``seq``: built already, or built from its draft as known now (not kept)."""
        return record_now(self._records, seq, None if self._slots is None else self._slots.stats)

    def _summarize(
        self, data: torch.Tensor, seq: int, rid: str
    ) -> tuple[Stats | None, str | None, str | None]:
        """(stats, crc, tensor key) of a tensor not seen before and not read at capture, as the
        mode says; stats and hash modes queue it for the step's end (``_flush``). ``rid``: the
        record's id, for live compare only (not built otherwise: this runs for every record).
        Called by ``capture`` only, inside its busy section (its torch calls are not ops)."""
        if self._live is not None:  # one host sync per record: see live_golden.py
            return (*self._live.summarize(data, rid, crc=self.mode == "hash"), None)
        if self.mode == "stats":
            self._pending[seq] = (self._buffer.add_stats(data), None)
        elif self.mode == "hash":
            # NaN/Inf evidence: statistics, at the step's end, of a float tensor whose
            # sum is not finite; hashes are still compared.
            sh = self._buffer.add_evidence(data) if data.is_floating_point() else None
            self._pending[seq] = (sh, self._buffer.add_crc(data))
        else:  # tensor mode: the stats of the copy when the trace is taken, or queued now
            key = f"t{seq:07d}"
            later = self._kept.keep(key, data)
            self._pending[seq] = (None if later else self._buffer.add_stats(data), None)
            return None, None, key
        return None, None, None

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

    def _drain_in_graph(self) -> None:
        """Under compile: the module calls the compiled graph recorded, as drafts (``compiled_records``)."""
        if self._graph is not None:
            self._graph.drain(self._records, self._calls, self._last_call, self._not_recordable, self._step)

    # -- explicit records: the parameters' and their grads' (ParamRecords) ------------------
    # -- result -------------------------------------------------------------------------
    def trace(self, manifest: Mapping[str, Any] | None = None) -> Trace:
        self._flush()
        built = cast(list[Record], self._records)  # every record is built at a step's end
        self._records[:] = self._kept.fill_stats(built)
        records = tuple(built)
        meta = dict(manifest or {})
        meta["record_mode"] = self.mode
        if self._live is not None:
            meta["live"] = self._live.manifest()
            self._live.end_step()
        if self.level != "module":
            meta["record_level"] = self.level
            meta["parents"] = dict(self._parents)
        trace = Trace(manifest=meta, records=records, tensors=dict(self._tensors))
        if not (self._not_recordable or self.compiled):
            return trace
        compiled = None
        if self.compiled:
            graph = self._graph
            compiled = splits_note(self.mode, self.level) if graph is None else graph.note(bool(records))
        return trace.with_notes(not_recordable=dict(self._not_recordable), compiled=compiled)
