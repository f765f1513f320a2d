"""The ranks' agreement on what a step of a sharded model records (``check_sharded_recording``
in ``sharded_layout.py``), through the process group's key-value store, not a collective.

Every ``Recorder.start`` of a rank whose model holds DTensors writes one row (step, recorded or
not, a checksum of the Recorder's options) under ``precalign/<root>/<n>/rank<R>`` in the store
torch's default process group was made with (``init_process_group``'s TCPStore), counts itself
in and waits, at most ``PRECALIGN_RANK_WAIT`` seconds (600 unless set), until every rank of the
world has written its ``n``-th row. Then rows that differ raise one ``RecorderError`` on every
rank (``disagreement``); a rank that never came (never called ``start()`` for that step, stopped
recording early, crashed before it) raises one ``RecorderError`` on each rank that waited, naming
the ranks that did not arrive; a rank that comes after the others gave up raises too.

Why the store and not a collective: a collective of the tool on the default group (or on the
FSDP2 mesh's, the same group for a 1-D mesh over the world) would be matched, on a rank that
never called ``start()``, against the user's own collectives (FSDP2's all-gathers), and would
wait without bound; a process group of its own would be made by a collective call named by a
per-process counter (``new_group``), which a missing rank desynchronises for the user's later
groups. Store requests are matched by key only, and ``Store.wait`` takes a timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, RecorderError

WAIT_VARIABLE = "PRECALIGN_RANK_WAIT"
DEFAULT_WAIT_S = 600.0
_SEQUENCE: dict[str, tuple[int, str]] = {}  # per recording root: the checks made on it, the last row
_ROOTS: dict[str, int] = {}  # each recording root's place among those this process checked


def wait_seconds() -> float:
    """``PRECALIGN_RANK_WAIT`` (seconds a rank waits for the others at ``start()``), else 600."""
    said = os.environ.get(WAIT_VARIABLE, "").strip()
    if not said:
        return DEFAULT_WAIT_S
    try:
        value = float(said)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"environment variable {WAIT_VARIABLE}={said!r}: expected a number of seconds > 0")
    return value


def options_row(options: Mapping[str, Any], mode: str, step: int, selected: bool) -> tuple[str, str]:
    """(this rank's row, the options it summarises, as said in a message)."""
    said = json.dumps({k: repr(v) for k, v in {**options, "mode": mode}.items()}, sort_keys=True)
    digest = hashlib.sha256(said.encode()).hexdigest()[:14]
    return f"{step},{int(selected)},{digest}", said


def agree(root: Path, row: str, said: str) -> None:
    """Write this rank's ``row`` for the next check on ``root``, wait for every rank's (module doc)."""
    from torch.distributed.distributed_c10d import _get_default_store

    dist = torch.distributed
    rank, world, seconds = dist.get_rank(), dist.get_world_size(), wait_seconds()
    # The roots in the order this process first checked them: ranks that each record into a
    # root of their own (a folder per rank) still meet, as SPMD code makes its Recorders alike.
    tag = str(_ROOTS.setdefault(str(Path(root).resolve()), len(_ROOTS)))
    n, last = _SEQUENCE.get(tag, (0, ""))
    _SEQUENCE[tag] = (n + 1, row)
    store = _get_default_store()
    key = f"precalign/{tag}/{n}"
    store.set(f"{key}/rank{rank}", row)
    store.add(f"{key}/row/{row}", 1)
    if store.add(f"{key}/arrived", 1) == world:
        store.set(f"{key}/all", "1")
    try:
        store.wait([f"{key}/all"], timedelta(seconds=seconds))
    except dist.DistStoreError:
        store.set(f"{key}/gave_up", str(rank))
        missing = [r for r in range(world) if not store.check([f"{key}/rank{r}"])]
        raise RecorderError(_absent(missing, row, seconds)) from None
    if store.check([f"{key}/gave_up"]):
        raise RecorderError(
            f"Recorder: rank {rank} reached start() for step {row.split(',')[0]} after rank "
            f"{store.get(f'{key}/gave_up').decode()} gave up waiting for it ({WAIT_VARIABLE}={seconds:g} s)"
        )
    if store.add(f"{key}/row/{row}", 0) != world:
        rows = [r.decode() for r in store.multi_get([f"{key}/rank{r}" for r in range(world)])]
        raise RecorderError(disagreement([_parsed(r) for r in rows], said))
    if n:  # every rank is past check n - 1: its keys go
        store.delete_key(f"precalign/{tag}/{n - 1}/rank{rank}")
        if rank == 0:
            for name in ("arrived", "all", f"row/{last}"):
                store.delete_key(f"precalign/{tag}/{n - 1}/{name}")


def _parsed(row: str) -> tuple[int, int, int]:
    step, selected, digest = row.split(",")
    return int(step), int(selected), int(digest, 16)


def _absent(missing: Sequence[int], row: str, seconds: float) -> str:
    step = row.split(",")[0]
    return (
        f"Recorder: ranks {list(missing)} did not reach start() for step {step} within {seconds:g} s "
        f"({WAIT_VARIABLE}); the DTensors' records of a sharded model (FSDP2, tensor parallelism) are "
        "combined over every rank, so every rank must call start() and stop() on the same steps "
        "(a rank that stopped recording early, crashed or skipped the step)"
    )


def disagreement(rows: Sequence[tuple[int, ...]], said: str) -> str:
    """The message for ranks whose rows (step, recorded, options checksum) differ."""

    def ranks_where(col: int, value: int) -> list[int]:
        return [r for r, row in enumerate(rows) if row[col] == value]

    parts = []
    if len({row[0] for row in rows}) > 1:
        parts.append(
            "they are at other steps (" + ", ".join(f"rank {r}: {row[0]}" for r, row in enumerate(rows)) + ")"
        )
    if len({row[1] for row in rows}) > 1:
        parts.append(f"ranks {ranks_where(1, 1)} record this step, ranks {ranks_where(1, 0)} do not (steps=)")
    if len({row[2] for row in rows}) > 1:
        parts.append(
            f"ranks {ranks_where(2, rows[0][2])} and {[r for r, row in enumerate(rows) if row[2] != rows[0][2]]} "
            f"were given other Recorder options (this rank's: {said})"
        )
    return (
        "Recorder: the ranks of this sharded model (DTensor parameters: FSDP2, tensor parallelism) do not "
        f"record alike at step {rows[0][0]}: {'; '.join(parts)}. Their DTensors' records are combined over "
        "every rank, so every rank must call start() and stop() on the same steps with the same options "
        "(mode, include, exclude, inputs, grads, params, param_grads, steps)"
    )
