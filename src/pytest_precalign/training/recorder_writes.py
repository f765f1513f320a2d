"""Where a ``Recorder``'s steps go: the root claimed for the run (``run_root``), each
selected rank's ``ROOT/step<N>/rank<R>/`` written (a trace folder, atomic, or msprobe's
layout; a step without layer records: its manifest alone), and a write failure turned into
one ``RecorderError`` and a note a later compare reports (``trace.write_failures``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import RecorderError
from ..recording import HookRecorder
from ..recording.tensor_sink import TensorSink
from ..steps.layout_probe import process_rank
from ..trace.native_io import finish_trace, write_trace
from ..trace.records import Trace
from ..trace.run_ids import RUN_ID_KEY, kept_manifest, new_run_id, run_ids
from ..trace.run_parts import CONTINUES_KEY, read_pointer
from ..trace.write_failures import (
    close_write_note,
    leave_write_failure_note,
    open_write_note,
    write_failure_reason,
)
from .recorder_evidence import RecorderEvidence, step_evidence_keys
from .recorder_options import grads_missing_note
from .run_root import claim_root, first_part


class RecorderWrites(RecorderEvidence):
    """The writing half of ``Recorder`` (which sets the attributes declared here)."""

    root: Path
    format: str
    layout: dict[str, Any] | None
    overwrite: bool
    ranks: frozenset[int] | None
    params: bool
    param_grads: str
    _grads_done: bool
    _claimed: bool
    _run: dict[str, Any]  # run_id (and launch_id, continues) of every manifest (trace.run_ids)
    _first: Path | None  # the root of the run's first part (seek(continues=))
    _facts: dict[str, Any]
    _parallel: dict[str, Any]
    _wrappers: list[str]

    @property
    def rank(self) -> int:
        """This process's global rank (``layout["rank"]`` if given, 0 without a process group)."""
        if self.layout is not None and "rank" in self.layout:
            return int(self.layout["rank"])
        return process_rank()[1]

    def folder(self, step: int | None = None) -> Path:
        """``ROOT/step<N>/rank<R>`` of this rank."""
        return self.root / f"step{self._step if step is None else step}" / f"rank{self.rank}"

    def _claim(self) -> None:
        """The root holds this run from the current step on (``run_root``: refused, replaced
        or continued before the first step trains). A run resumed into a root holding none of
        its earlier steps, told where they are (``seek(step, continues=FIRST_ROOT)``), keeps the
        first part's ``run_id`` and points to it from every manifest (``trace.run_parts``)."""
        if self._claimed:
            return
        kept = claim_root(self.root, self.rank, self._step, overwrite=self.overwrite, owner=self)
        if kept:  # resumed into its own root: its id, and its pointer if it has one, go on
            held = kept_manifest(self.root, self.rank, kept)
            found = held.get(RUN_ID_KEY)
            run_id = found if isinstance(found, str) and found else new_run_id()
            pointer = read_pointer(held, str(self.folder(kept[-1])))
        elif self._first is not None and self._step > 0:
            pointer = first_part(self._first, self.root, self.rank, self._step)
            run_id = pointer.run_id
        else:
            run_id, pointer = new_run_id(), None
        self._claimed, self._continues = True, bool(kept) or pointer is not None
        self._run = {**run_ids(run_id), **({CONTINUES_KEY: pointer.as_json()} if pointer else {})}

    def _write(self, hooks: HookRecorder, sink: TensorSink | None) -> Path:
        missing: list[str] = []
        try:
            if self.param_grads == "step" and not self._grads_done:
                found, missing = hooks.record_param_grads()
                missing = missing if not found else []  # none at all: zeroed before stop()?
            if self.params:
                hooks.record_params()
        finally:
            hooks.__exit__(None, None, None)
        run = self._step_evidence()
        manifest: dict[str, Any] = {
            "recorder": "pytest_precalign.Recorder",
            "step": self._step,
            "rank": self.rank,
            "torch_version": torch.__version__,
            **self._run,
            **self._facts,
            **({"dtype": self._precision} if self._precision else {}),
            "parallel": self._parallel,
            **step_evidence_keys(run),
        }
        if self._wrappers:
            manifest["wrappers"] = self._wrappers

        def write() -> Path:
            shards = None
            if sink is not None:
                shards = sink.close()
                manifest["writer"] = sink.report()
            trace = hooks.trace(manifest, run).with_notes(
                param_grads=self.param_grads,  # "step": reduced over DP (``parallel.dp_join``)
                grads_missing=(grads_missing_note(self._step, self.rank, missing),) if missing else (),
            )
            if sink is not None:
                out, over = self.folder(), self.overwrite
                return finish_trace(
                    trace, sink.folder, out, shards=shards, digests=sink.digests, overwrite=over
                )
            if self.format == "msprobe":
                from ..msprobe.writer import write_msprobe_dump

                return write_msprobe_dump(
                    trace,
                    self.root,
                    step=self._step,
                    rank=self.rank,
                    overwrite=self.overwrite,
                    keep_manifest=True,
                )
            return write_trace(trace, self.folder(), overwrite=self.overwrite)

        path = self._published(write)
        self.written.append(path)
        return path

    def _published(self, write: Callable[[], Path]) -> Path:
        """``write()``'s folder. A write failure (a full disk, a permission, a quota) is one
        ``RecorderError`` naming the step and the folder; nothing of the step is left half
        written, only a note beside the rank's folder saying why it is missing, which a later
        compare reports (``parallel.steps``)."""
        folder = self.folder()
        made = tuple(p for p in (folder.parent, *folder.parent.parents) if not p.exists())
        note = open_write_note(folder)
        try:
            path = write()
        except OSError as exc:
            reason = write_failure_reason(exc)
        except BaseException:  # the background writer's TraceError says it all, and leaves nothing
            close_write_note(note)
            raise
        else:
            close_write_note(note)
            return path
        left = leave_write_failure_note(note, self._step, reason, made)
        told = f"; {left} says so to a later compare" if left is not None else ""
        raise RecorderError(
            f"Recorder: step {self._step} was not recorded: cannot write {folder}: {reason}; "
            f"nothing of the step was kept{told}"
        ) from None

    def _write_scalars_only(self) -> Path | None:
        """A step without layer records: its scalars (if any) alone, on a selected rank."""
        if self._scalars is None or (self.ranks is not None and self.rank not in self.ranks):
            return None
        self._claim()
        run = self._step_evidence()
        manifest: dict[str, Any] = {
            "recorder": "pytest_precalign.Recorder",
            "step": self._step,
            "rank": self.rank,
            "record_mode": "scalars",
            **self._run,
            **(self._facts if not self.written else {}),  # versions etc.: once, for env-diff
            **({"dtype": self._precision} if self._precision else {}),
            **step_evidence_keys(run),
        }
        path = self._published(
            lambda: write_trace(
                Trace(manifest=manifest, records=(), tensors={}, run=run),
                self.folder(),
                overwrite=self.overwrite,
            )
        )
        self.written.append(path)
        return path
