"""Tensor mode's background writer: a bounded queue of host copies and one thread that packs
them into safetensors shards in a trace's temporary folder while the step runs.

``put(key, tensor)`` reserves the tensor's bytes in the queue (waiting, counted in ``waits``,
only while the bytes queued and not yet on disk would exceed ``queue_bytes``), then copies
the tensor to the host: on the CPU a plain copy, as before; on CUDA a pinned buffer filled by
a non-blocking copy, which the writer thread waits for (a device event), not the step. A
tensor larger than the bound is admitted alone, once the queue is empty. The writer thread
gathers tensors into a shard and writes it when it reaches ``shard_bytes`` (at most the bound)
or when the step is waiting for room; ``close()`` writes the rest, joins the thread and
returns ``key -> shard file``. The peak extra host memory is therefore the bound.

A failure of the writer (a full or read-only disk) removes the temporary folder at once and
is raised as one ``TraceError`` naming the target folder by the next ``put`` (after calling
``on_error``, which removes the recorder's hooks) or by ``close()``. ``abort()`` stops the
thread and removes the temporary folder (and the folders ``made`` for it, when empty). No
thread outlives ``close()`` or ``abort()``.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import TraceError
from ..trace.native_io import SHARD_BYTES, shard_name, write_shard

DEFAULT_QUEUE_BYTES = 256 << 20


class TensorSink:
    def __init__(
        self,
        folder: Path,
        *,
        target: Path,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        shard_bytes: int = SHARD_BYTES,
        on_error: Callable[[], None] | None = None,
        made: tuple[Path, ...] = (),
    ) -> None:
        self.folder = folder
        self._made = made  # folders made for this trace (``ROOT/step<N>``), removed with it if empty
        self.target = target  # the folder named in errors (``folder`` is its temporary sibling)
        self.queue_bytes = queue_bytes
        self._shard_bytes = max(1, min(shard_bytes, queue_bytes))
        self._on_error = on_error
        self._cond = threading.Condition()
        self._items: deque[tuple[str, torch.Tensor, Any, int]] = deque()
        self._queued = 0  # bytes put and not yet on disk (the queue and the shard being packed)
        self._waiting = 0  # producers waiting for room
        self._closing = False
        self._aborted = False
        self._error: BaseException | None = None
        self._shards: dict[str, str] = {}
        self.digests: dict[str, str] = {}  # shard file -> sha256 (the folder's checksums)
        self.peak_queued_bytes = 0
        self.waits = 0
        self._thread = threading.Thread(target=self._run, name="precalign-tensor-writer", daemon=True)
        self._thread.start()

    # -- the recording thread ------------------------------------------------------------------
    def put(self, key: str, tensor: torch.Tensor) -> None:
        """Queue a host copy of ``tensor`` under ``key`` (waits only while the queue is full)."""
        nbytes = tensor.numel() * tensor.element_size()
        with self._cond:
            if self._error is None and self._queued and self._queued + nbytes > self.queue_bytes:
                self.waits += 1
                self._waiting += 1
                self._cond.notify_all()
                while self._error is None and self._queued and self._queued + nbytes > self.queue_bytes:
                    self._cond.wait()
                self._waiting -= 1
            if self._error is not None or self._closing or self._aborted:
                failed = self._error is not None
            else:
                failed = False
                self._queued += nbytes
                self.peak_queued_bytes = max(self.peak_queued_bytes, self._queued)
        if failed:
            if self._on_error is not None:
                self._on_error()
            raise self._failure()
        if self._closing or self._aborted:
            raise TraceError(f"{self.target}: the background writer is closed; nothing more can be queued")
        try:
            host, ready = _host_copy(tensor)
        except BaseException:  # e.g. out of host memory: the reservation is given back
            with self._cond:
                self._queued -= nbytes
                self._cond.notify_all()
            raise
        with self._cond:
            self._items.append((key, host, ready, nbytes))
            self._cond.notify_all()

    def close(self) -> dict[str, str]:
        """Write what is queued, stop the thread; ``key -> shard file`` (TraceError on failure)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._failure()
        return dict(self._shards)

    def abort(self) -> None:
        """Stop the thread without writing more, and remove the temporary folder."""
        with self._cond:
            self._aborted = True
            self._items.clear()
            self._cond.notify_all()
        self._thread.join()
        self._remove_folder()

    def _remove_folder(self) -> None:
        """The temporary folder, and the folders made for it that are left empty (deepest
        first): a failed or abandoned step leaves no empty ``ROOT/step<N>/`` behind."""
        shutil.rmtree(self.folder, ignore_errors=True)
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:  # not empty (another rank's folder), or gone
                break

    def report(self) -> dict[str, int]:
        """The manifest's ``"writer"`` entry."""
        return {
            "queue_bytes": self.queue_bytes,
            "peak_queued_bytes": self.peak_queued_bytes,
            "waits": self.waits,
        }

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _failure(self) -> TraceError:
        exc = self._error
        errno = re.search(r"\(os error (\d+)\)", str(exc))  # safetensors' wrapped I/O error
        if isinstance(exc, OSError) and exc.strerror:
            reason = exc.strerror
        elif errno is not None:
            reason = os.strerror(int(errno.group(1)))
        else:
            reason = f"{type(exc).__name__}: {exc}"
        return TraceError(
            f"{self.target}: cannot write the trace's tensors: {reason} "
            "(background writer; nothing was written, its temporary folder is removed)"
        )

    # -- the writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        batch: dict[str, torch.Tensor] = {}
        size = 0
        try:
            while True:
                with self._cond:
                    while not (self._items or self._aborted or self._closing or (batch and self._waiting)):
                        self._cond.wait()
                    if self._aborted:
                        return
                    item = self._items.popleft() if self._items else None
                    done = item is None and self._closing
                if item is not None:
                    key, host, ready, nbytes = item
                    if ready is not None:
                        ready.synchronize()  # the non-blocking device-to-host copy has landed
                    batch[key] = host
                    size += nbytes
                    if size < self._shard_bytes:
                        continue
                if batch:
                    self._write(batch, size)
                    batch, size = {}, 0
                if done:
                    return
        except BaseException as exc:  # a full or read-only disk, ...: reported to the step
            batch.clear()
            self._remove_folder()
            with self._cond:
                self._error = exc
                self._items.clear()
                self._queued = 0
                self._cond.notify_all()

    def _write(self, batch: dict[str, torch.Tensor], size: int) -> None:
        file = shard_name(len(set(self._shards.values())))
        self.digests[file] = write_shard(batch, self.folder / file)
        for key in batch:
            self._shards[key] = file
        with self._cond:
            self._queued -= size
            self._cond.notify_all()


def _host_copy(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """A contiguous host copy, and the event the writer waits for (None: copied already)."""
    if tensor.device.type == "cpu":
        host = torch.empty(tensor.shape, dtype=tensor.dtype)
        host.copy_(tensor)
        return host, None
    pinned = tensor.device.type == "cuda"
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pinned)
    try:
        event = torch.Event(device=tensor.device)
    except (RuntimeError, TypeError, ValueError):  # no event for this device: copy synchronously
        host.copy_(tensor)
        return host, None
    host.copy_(tensor, non_blocking=True)
    event.record()
    return host, event
