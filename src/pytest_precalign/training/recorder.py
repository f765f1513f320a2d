"""Record inside the user's own (distributed) training loop: ``pytest_precalign.Recorder``.

>>> rec = Recorder("runs/mindspeed", mode="tensor", steps=[0, 1])
>>> for step, batch in enumerate(loader):
...     rec.start(model)      # an nn.Module, or a list of model chunks (virtual pipeline)
...     loss = train_step(model, batch, optimizer)    # forward, backward, optimizer.step()
...     rec.stop()            # parameters after the optimizer step are recorded here
...     rec.step()

Parameter grads are recorded, by default, as the backward accumulates them
(``param_grads="backward"``: each micro-batch's accumulation is a call), before the loop
reduces them. With ``param_grads="step"`` they are recorded once per step as the optimizer sees
them (Megatron's ``main_grad`` where a parameter has one, else ``.grad``): at
``rec.grads_ready()``, called after the loop's reduction (Megatron's ``finalize_model_grads``:
tensor-parallel all-reduce of q/k layernorm and sequence-parallel grads, tied embeddings across
stages, data parallel) and before ``optimizer.step()``, or at ``stop()`` if it was not called.

Each rank writes ``ROOT/step<N>/rank<R>/``: a trace directory (``format="native"``, atomic:
a folder is visible only once complete) or msprobe's dump layout (``format="msprobe"``).
Without a process group the rank is 0. In tensor mode with the native format, tensors are
written while the step runs by a background writer (``recording/tensor_sink.py``): a bounded
queue of host copies (``queue_bytes``) that a thread packs into safetensors shards in the
folder's temporary sibling; the manifest's ``"writer"`` key reports the bound, the peak bytes
queued and how often the step waited. The msprobe format writes its files at ``stop``.
The manifest's ``"parallel"`` key says where the rank sits in the run (see ``parallel_layout``). A step or rank that ``steps=`` / ``ranks=`` does
not select adds no hooks at all. A forward that raises between ``start`` and ``stop`` gives
the step up at once: its hooks, op mode, writer thread and temporary folder are removed and
nothing is written (``stop()`` returns None; ``recording/forward_guard.py``). What a raise
elsewhere in the step (the loss, the backward, the optimizer) left is removed by the next
``start``, by ``close()`` and on leaving ``with Recorder(...)``; ``with rec.recording(model):``
does start, stop and step in one. Misuse is one ``RecorderError`` each: ``step()`` before
``stop()``, a model on the meta device, ``start`` given no module, a module name msprobe's
format cannot store, a forward on another thread at level op/mix (``model_checks``).
Recording is bitwise neutral: tensors are only read (see ``recorder``).

Per-step scalars (``StepScalars``: loss, LR per group, grad norm before clipping, clip
coefficient, update/param norms, zero grads, tokens, batch hash...; measured with
``steps.step_evidence``) go into the step's manifest with ``rec.record_scalars(...)``
before ``stop()``, on every step of a selected rank (a step ``steps=`` does not select gets a
folder holding only its manifest); ``rec.record_initial_params(model)`` before step 0 writes
the parameters' summaries before any update.

The run's settings and plan (``trace.training_record.TrainingSettings``; what ``precalign
compare`` checks before the numbers) go into the next folder's manifest with
``rec.record_settings(model, optimizer, scheduler, steps=N, clip_grad=1.0, micro_batches=2,
loss_normalisation="per_token_over_step", precision="bfloat16", autocast=True,
arguments={...})`` before step 0: the LR of every group at each of the ``N`` planned steps from
the loop's own scheduler (stepped and put back exactly, ``steps.run_settings``), the
groups' weight decay and parameter names, the optimizer's betas / eps / momentum, the PEFT
adapters and the frozen parameters; ``arguments`` are the loop's own settings, as JSON. With a
``precision`` (or an autocast run), every later manifest's ``dtype`` says it. Parameter names
(``initial_params``, the plan, ``frozen``) are the records': inside the model's wrappers.

``mode="scalars"`` adds no hooks at all: each step's folder is its manifest alone (a few
hundred bytes; the first also holds the run's environment, for ``precalign env-diff``), for
runs of thousands of steps. Every recorder defaults to ``stats``; ``PrecalignCallback`` alone
defaults to ``scalars`` (per-step scalars only, no hooks: cheap enough to leave on for a whole
run). ``PrecalignCallback`` (``hf_callback``) does all this for a ``transformers.Trainer`` run.

``golden=PATH`` compares each record while recording against a golden run (a trace folder,
a Recorder root whose ``step<N>/rank<R>`` is picked for the current step and rank, or an
msprobe dump) under ``tolerances=`` (a table or its YAML file; default: the dtype's), and
keeps full tensors only where they are beyond tolerance (plus their module's inputs), see
``live_compare``. The manifest's ``"live"`` key says what was compared and kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..compare.tolerances import ToleranceTable, load_table
from ..errors import ConfigError, RecorderError
from ..recording import HookRecorder
from ..recording.module_names import class_name
from ..recording.tensor_sink import DEFAULT_QUEUE_BYTES, TensorSink
from ..steps.layout_probe import check_layout, parallel_layout
from ..steps.model_checks import ChunksRoot, check_recordable, chunks_of
from ..steps.sharded_layout import check_sharded_recording, watch_partials
from ..steps.step_sink import Deps
from ..steps.unwrap import hooks_before_compile, unwrap
from ..trace.native_io import begin_trace
from ..trace.records import Record
from ..trace.step_markers import begin_step, end_step
from ..vocabulary import MODEL_OUTPUT_KINDS, RECORD_FORMAT_ALIASES, RecordingMode, as_kind, as_recording_mode
from .golden import golden_judge
from .recorder_options import (
    check_choices,
    checked_queue_bytes,
    golden_path,
    selection,
)
from .recorder_writes import RecorderWrites
from .run_facts import model_config, run_environment
from .run_root import release_root


class Recorder(RecorderWrites):
    """Record the selected steps of a training loop on each selected rank (see module doc)."""

    def __init__(
        self,
        root: str | Path,
        *,
        mode: str = "stats",
        level: str = "module",
        steps: Iterable[int] | None = None,
        ranks: Iterable[int] | None = None,
        format: str = "native",
        layout: dict[str, Any] | None = None,
        overwrite: bool = False,
        inputs: bool = True,
        grads: bool = True,
        include: tuple[str, ...] = (),
        exclude: tuple[str, ...] = (),
        params: bool = True,
        param_grads: str = "backward",
        golden: str | Path | None = None,
        tolerances: str | Path | ToleranceTable | None = None,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
    ) -> None:
        check_choices(mode=mode, level=level, format=format, param_grads=param_grads)
        self.golden = golden_path(golden, mode)
        self.queue_bytes = checked_queue_bytes(queue_bytes)
        self.tolerances = load_table(tolerances, "Recorder: tolerances")
        self.root = Path(root)
        self.mode: RecordingMode = as_recording_mode(mode)
        self.level = level
        self.format = RECORD_FORMAT_ALIASES.get(format, format)
        self.layout = check_layout(layout) if layout is not None else None
        self.overwrite = overwrite
        self.steps = selection(steps, "steps")
        self.ranks = selection(ranks, "ranks")
        self._options: dict[str, Any] = {
            "inputs": inputs,
            "grads": grads,
            "include": include,
            "exclude": exclude,
            "param_grads": param_grads,
        }
        self.param_grads = param_grads
        self._grads_done = False  # this step's grads recorded by grads_ready()
        self.params = params  # record parameters at stop() (after the optimizer step)
        self._step = 0
        self._hooks: HookRecorder | None = None
        self.compiled = False  # runs under torch.compile unseen by start() (a Trainer's torch_compile)
        self._sink: TensorSink | None = None  # tensor mode, native format: the background writer
        self._parallel = {}
        self._wrappers = []  # the wrappers the recorded model was found in
        self._facts = {}  # the environment and the model's config, at start()
        self._output_calls: dict[str, int] = {}
        self._scalars = None  # this step's, written at stop()
        self._initial = None  # initial_params, written with the next folder
        self._settings = None  # the run's settings, written with the next folder
        self._precision = None  # what the forward computes in (the settings'), every manifest
        self.written = []  # the folders this process wrote, in order
        self._claimed = self._continues = False  # the root holds this run; it continues a resumed run's
        self._run, self._first = {}, None  # every manifest's run_id...; the first part's root (seek)
        self._marker: Path | None = None  # the rank folder whose step began and has not ended
        self._marker_made: tuple[Path, ...] = ()  # the folders made for its marker

    # -- where we are -------------------------------------------------------------------
    @property
    def current_step(self) -> int:
        """The step the next ``start`` records (0 first; ``step()`` advances it)."""
        return self._step

    def selected(self) -> bool:
        """Whether the current step on this rank is recorded."""
        return (self.steps is None or self._step in self.steps) and (
            self.ranks is None or self.rank in self.ranks
        )

    @property
    def in_step(self) -> bool:
        """Whether a step was started on this rank and has not ended yet."""
        return self._marker is not None

    @property
    def recording_now(self) -> bool:
        return self._hooks is not None

    # -- the loop -------------------------------------------------------------------------
    def start(self, model: torch.nn.Module | Sequence[torch.nn.Module]) -> None:
        """Add the hooks for this step (nothing if the step or rank is not selected)."""
        self._discard()  # hooks of a step whose forward or backward raised
        self._scalars = None
        self._claim()
        self._end_step()  # a step given up before (its error was caught): it did not stop the run
        if self.ranks is None or self.rank in self.ranks:
            self._marker = self.folder()
            self._marker_made = begin_step(self._marker)
        try:
            self._start(model)
        except BaseException:  # refused (misuse): the step never began
            self._end_step()
            raise

    def _start(self, model: torch.nn.Module | Sequence[torch.nn.Module]) -> None:
        check_sharded_recording(self, model)  # the ranks agree on what this step records
        if not self.selected() or self.mode == "scalars":
            if self.mode == "stats" and self.level == "module" and self.golden is None:
                hooks_before_compile(model, self.compiled)  # in the graph (recording/compiled_stats.py)
            if not self.written and not self._facts:  # the environment, in the first folder
                self._facts = run_environment([unwrap(c)[0] for c in chunks_of(model)])
            return
        unwrapped = [unwrap(c) for c in chunks_of(model)]  # DDP, FSDP, Float16Module, compile, PEFT
        chunks = [inner for inner, _ in unwrapped]
        self._wrappers = sorted({w for _, seen in unwrapped for w in seen})
        prefixes = [""] if len(chunks) == 1 else [f"chunk{k}." for k in range(len(chunks))]
        target = chunks[0] if len(chunks) == 1 else ChunksRoot(chunks)
        check_recordable(target, self.format)
        self._parallel = parallel_layout(chunks, prefixes, self.layout)
        self._facts = {**run_environment(chunks), "model_config": model_config(chunks)}
        judge = None
        if self.golden is not None:
            judge = golden_judge(self.golden, self._step, self.rank, self.tolerances)
        if self.mode == "tensor" and self.format == "native":
            folder = self.folder()
            made = tuple(p for p in (folder.parent, *folder.parent.parents) if not p.exists())
            self._sink = TensorSink(
                begin_trace(folder),
                target=folder,
                queue_bytes=self.queue_bytes,
                on_error=self._write_failed,
                made=made,
            )
        hooks = HookRecorder(
            target,
            mode=self.mode,
            level=self.level,
            golden=judge,
            sink=self._sink,
            compiled=self.compiled or any(w.endswith(".OptimizedModule") for w in self._wrappers),
            in_graph=len(chunks) == 1,
            on_raise=self._discard,  # a forward that raised: the step is given up at once
            **self._options,
        )
        hooks.step = self._step
        try:
            hooks.__enter__()
        except BaseException:
            self._discard()
            raise
        hooks._handles += watch_partials(chunks, prefixes, self._parallel.get("dtensors"))  # tp_partials.py
        self._hooks = hooks
        self._grads_done = False
        self._output_calls.clear()

    def record_output(
        self, kind: str, tensor: Tensor, deps: Deps = (), name: str | None = None, call: int | None = None
    ) -> Record | None:
        """Record the loss or the logits of this step (nothing while not recording); ``deps``:
        the ids of the records it was computed from (the loss's logits); ``name``: the record's
        name when it is not the kind's (TRL's fused LM head gives ``log_probs``, not logits).
        Called once per micro-batch, the records are calls 0, 1, ... like a module's (``call``:
        the micro-batch's, when the caller counts them)."""
        if kind not in MODEL_OUTPUT_KINDS:
            raise ConfigError(
                f"Recorder.record_output: unknown kind {kind!r} (allowed: {', '.join(MODEL_OUTPUT_KINDS)})"
            )
        hooks = self._hooks
        if hooks is None:
            return None
        name = name or kind
        call = self._output_calls.get(name, 0) if call is None else call
        self._output_calls[name] = call + 1
        cls = class_name(hooks.model)
        return hooks.capture(
            tensor, name=name, module_class=cls, kind=as_kind(kind), slot="", call=call, deps=deps
        )

    def grads_ready(self, micro_batches: int | None = None) -> None:
        """With ``param_grads="step"``: record the parameters' grads now, as the optimizer
        will see them. Call it after the loop reduced them and before ``optimizer.step()``,
        once per step (nothing while not recording). ``micro_batches``: the grads were
        accumulated over that many: recorded as the last micro-batch's call."""
        if self.param_grads != "step":
            raise ConfigError('Recorder.grads_ready: needs Recorder(..., param_grads="step")')
        hooks = self._hooks
        if hooks is None:
            return
        if self._grads_done:
            raise ConfigError(f"Recorder.grads_ready: called twice in step {self._step}")
        self._grads_done = True
        hooks.record_param_grads(micro_batches)

    def updated(self) -> None:
        """The step's optimizer update is done (a ``StepSink`` event): its parameters wait for ``stop()``."""

    def stop(self) -> Path | None:
        """Record the parameters (after the optimizer step), remove the hooks and write this
        rank's folder; returns it (None when this step or rank is not recorded)."""
        try:
            hooks = self._hooks
            if hooks is None:
                return self._write_scalars_only()
            if hooks.gave_up:  # its forward raised
                self._discard()
                return None
            self._hooks = None
            sink, self._sink = self._sink, None
            try:
                return self._write(hooks, sink)
            except BaseException:
                if sink is not None:
                    sink.abort()
                raise
        finally:
            self._end_step()

    def _end_step(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None:
            end_step(marker, self._marker_made)

    def step(self) -> None:
        """Advance the step counter (call once per training step, after ``stop``)."""
        if self._hooks is not None:
            raise RecorderError(
                f"Recorder.step: step {self._step} is still being recorded: call stop() first "
                f"(it writes step{self._step}/), then step()"
            )
        self._end_step()
        self._step += 1

    def seek(self, step: int, continues: str | Path | None = None) -> None:
        """Set the step the next ``start`` records (a run resumed at ``step``). ``continues``:
        the root the run recorded its steps before ``step`` into, when it resumes into another
        root: the new root's manifests point to it and a compare joins the two into one run
        (``trace.run_parts``); refused at the next ``start`` when it holds none of them. A
        root that holds the run's earlier steps itself needs none (the run continues there)."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"Recorder.seek: step must be an integer >= 0, got {step!r}")
        if continues is not None:
            if self._claimed:
                raise ConfigError(
                    "Recorder.seek: continues= after the run's first step: give it with the seek "
                    "to the step the run resumes at, before its first start()"
                )
            self._first = Path(continues)
        if step != self._step:
            self._end_step()
        self._step = step

    @contextlib.contextmanager
    def recording(self, model: torch.nn.Module | Sequence[torch.nn.Module]) -> Iterator[Recorder]:
        """``start``, then ``stop`` and ``step`` when the block completes; when it raises, the
        hooks are removed, nothing is written and the step is not advanced."""
        self.start(model)
        try:
            yield self
        except BaseException:
            self._discard()
            self._end_step()  # a step given up by its own block: nothing of it is left
            raise
        self.stop()
        self.step()

    # -- cleanup --------------------------------------------------------------------------
    def _discard(self) -> None:
        hooks, self._hooks = self._hooks, None
        sink, self._sink = self._sink, None
        try:
            if hooks is not None:
                hooks.__exit__(None, None, None)
        finally:
            if sink is not None:
                sink.abort()

    def _write_failed(self) -> None:
        """The background writer failed (its error is being raised from a hook): record
        nothing more. Module hooks are removed at once; an op mode cannot leave torch's mode
        stack from inside its own handler, so at level op/mix the hooks are made inert here and
        removed when the error leaves the forward (``forward_guard``)."""
        self._end_step()  # the step is given up with one error: nothing of it is left
        hooks = self._hooks
        if hooks is not None and hooks.level == "module":
            self._discard()
        elif hooks is not None:
            hooks._active = False

    def close(self, failed: bool = False) -> None:
        """Remove hooks a step left behind (its records are dropped); the root is free for
        another recorder. ``failed``: the run stopped inside its step (its marker says so)."""
        self._marker = None if failed else self._marker
        self._discard()
        self._end_step()
        if self._claimed:
            release_root(self.root, self.rank, self)
            self._claimed = False

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(failed=exc_type is not None)  # the run stopped inside this step
