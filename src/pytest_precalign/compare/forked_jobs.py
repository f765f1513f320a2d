"""Compare jobs shared with forked worker processes: the cores that threads cannot use.

numpy releases the GIL inside an operation, but comparing a pair is many short operations on
cache-sized chunks plus Python work per file (opening, mapping, parsing each ``.pt``). With
two threads on two cores the GIL and the shared address space (every unmapping interrupts
the other core) kept the 1 GB benchmark's compare at about the speed of one thread
(``benchmarks/compare_vs_msprobe.py``). Forked processes share neither.

``fork_usable`` says when forking is safe: POSIX ``fork``, no other Python thread, and no
torch in the process (its thread pools and device state do not survive a fork) -- that is
the ``precalign compare`` CLI reading dumps with numpy. Elsewhere (the pytest plugin, with
models in memory) the caller uses threads.

``run_forked``: the parent and ``workers - 1`` children take job indices from a pipe (4
bytes each, written in blocks a pipe write keeps whole, so a read of 4 bytes is one index;
no lock that a dying child could keep). Each child pickles its results back through a pipe
of its own, read by a thread of the parent so that a child never waits on a full pipe, and
leaves with ``os._exit``. Fail-safe: a job no child reported (it raised, the child died or
its results did not pickle) is run again in the parent, which then raises the job's own
error if it has one. The results do not depend on which process computed them.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

_INDEX = struct.Struct("<I")
_BLOCK = 1024  # indices per write: 4 KiB, which Linux writes to a pipe in one piece (PIPE_BUF)


def fork_usable() -> bool:
    """True when worker processes may be forked (see the module docstring)."""
    return (
        hasattr(os, "fork")
        and sys.platform != "darwin"  # macOS system libraries are not fork-safe
        and threading.active_count() == 1
        and "torch" not in sys.modules
    )


class _Reader(Generic[T]):
    """The parent's end of one child's result pipe, drained on a thread."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self._fd = fd
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._drain, name="precalign-compare-results", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while chunk := os.read(self._fd, 1 << 20):
                self._chunks.append(chunk)
        finally:
            os.close(self._fd)

    def results(self) -> dict[int, T]:
        """The child's results once it has exited; {} when it sent nothing readable."""
        self._thread.join()
        _, status = os.waitpid(self.pid, 0)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            return {}
        try:
            found = pickle.loads(b"".join(self._chunks))
        except Exception:
            return {}
        return found if isinstance(found, dict) else {}


def run_forked(
    order: Sequence[int],
    job: Callable[[int], T],
    workers: int,
    done: Callable[[int], None] | None = None,
) -> dict[int, T]:
    """``{i: job(i)}`` for every ``i`` of ``order`` (handed out in that order: put the largest
    jobs first), computed by this process and ``workers - 1`` forked ones. ``done(i)`` is
    called in this process as results arrive. Raises what ``job`` raises."""
    results: dict[int, T] = {}
    queue_r, queue_w = os.pipe()
    children: list[tuple[int, int]] = []
    readers: list[_Reader[T]] = []
    try:
        for _ in range(max(0, workers - 1)):
            children.append(_fork_child(queue_r, queue_w, job))
        readers = [_Reader(pid, fd) for pid, fd in children]  # threads only once all are forked
        writer = threading.Thread(
            target=_feed, args=(queue_w, order), name="precalign-compare-jobs", daemon=True
        )
        queue_w = -1  # the writer closes it
        writer.start()
        _take_jobs(queue_r, job, done, results)
        writer.join()
    except BaseException:
        for pid, _ in children:
            _kill(pid)
        raise
    finally:
        os.close(queue_r)
        if queue_w >= 0:
            os.close(queue_w)
        for reader in readers:
            for i, value in reader.results().items():
                results[i] = value
                if done is not None:
                    done(i)
        for pid, fd in children[len(readers) :]:  # forked, but no reader was started
            os.close(fd)
            os.waitpid(pid, 0)
    for i in order:  # what no child reported: run here (raising the job's own error, if any)
        if i not in results:
            results[i] = job(i)
            if done is not None:
                done(i)
    return results


def _fork_child(queue_r: int, queue_w: int, job: Callable[[int], T]) -> tuple[int, int]:
    """(pid, the read end of its result pipe)."""
    result_r, result_w = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns when forking beside native threads (numpy's BLAS)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(result_r)
        os.close(queue_w)
        _child(queue_r, result_w, job)
    os.close(result_w)
    return pid, result_r


def _feed(fd: int, order: Sequence[int]) -> None:
    try:
        for start in range(0, len(order), _BLOCK):
            block = order[start : start + _BLOCK]
            os.write(fd, b"".join(_INDEX.pack(i) for i in block))
    except OSError:  # every reader is gone (an error stopped the compare)
        pass
    finally:
        os.close(fd)


def _take_jobs(
    queue: int, job: Callable[[int], T], done: Callable[[int], None] | None, out: dict[int, T]
) -> None:
    while len(raw := os.read(queue, _INDEX.size)) == _INDEX.size:
        (i,) = _INDEX.unpack(raw)
        out[i] = job(i)
        if done is not None:
            done(i)


def _child(queue: int, result: int, job: Callable[[int], T]) -> None:
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the child, no traceback
        out: dict[int, T] = {}
        try:
            while len(raw := os.read(queue, _INDEX.size)) == _INDEX.size:
                (i,) = _INDEX.unpack(raw)
                out[i] = job(i)
        except Exception:
            pass  # the parent runs the failed job again and raises its error
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(result, view) :]
        code = 0
    finally:
        os._exit(code)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
