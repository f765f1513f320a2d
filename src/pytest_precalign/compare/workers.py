"""How many workers compare a case's tensor pairs (``compare_workers``): the user's
``PRECALIGN_COMPARE_THREADS``, else the cores other work leaves free now."""

from __future__ import annotations

import os
import time

from ..errors import ConfigError


def compare_workers() -> int:
    """Workers comparing tensor pairs: ``PRECALIGN_COMPARE_THREADS``, else the cores that are
    free now (``free_cores(cores, busy_now())``), at least 1, at most 4. Threads, or forked
    processes where that is safe (``compare.forked_jobs``)."""
    wanted = os.environ.get("PRECALIGN_COMPARE_THREADS", "").strip()
    if wanted:
        if not (wanted.isdigit() and int(wanted) > 0):
            raise ConfigError(
                f"environment variable PRECALIGN_COMPARE_THREADS={wanted!r}: expected a whole number >= 1"
            )
        return int(wanted)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return free_cores(cores, busy_now())


def busy_now(samples: int = 5, loadavg: str = "/proc/loadavg") -> float:
    """How many cores other work keeps busy now: the fewest runnable tasks seen in ``samples``
    reads of ``loadavg`` 1 ms apart (its fourth field, ``running/total``), less this one. The
    fewest: work that keeps a core busy is runnable in every read, a short task (a shell, a
    kernel thread) in few. Without that file, the 1-minute load average, which lags: right
    after another program's burst (the benchmark's msprobe compare) it still reads ~2 on an
    idle 2-core machine."""
    seen: int | None = None
    for n in range(samples):
        try:
            with open(loadavg, encoding="ascii") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            seen = None
            break
        seen = running if seen is None else min(seen, running)
        if n + 1 < samples:
            time.sleep(0.001)
    if seen is not None and seen >= 1:
        return float(seen - 1)
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def free_cores(cores: int, load: float) -> int:
    """Compare workers for ``cores`` usable cores while ``load`` of them are busy: the cores not
    busy (``cores - round(load)``), at least 1, at most 4.

    A worker on a core another process keeps busy only takes turns with it: on 2 cores at
    load ~1 a second compare thread made the 1 GB compare slower (0.78-0.85 s against
    0.67-0.69 s with one; CPU seconds equal to wall seconds with two, i.e. no overlap).
    ``PRECALIGN_COMPARE_THREADS`` overrides."""
    busy = int(load + 0.5) if load == load and load >= 0 else 0
    return max(1, min(4, cores - busy))
