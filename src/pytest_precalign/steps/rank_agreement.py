"""The ranks' agreement on what a step of a sharded model records (``check_sharded_recording``
in ``sharded_layout.py``), through the process group's key-value store, not a collective.

The agreement spans the ranks a rank's records are combined with, its *peers*: the ranks of
the mesh dimensions its DTensor parameters are split over (``record_peers`` in
``sharded_layout.py``: an FSDP2 mesh, a TP group), itself included. A rank whose records are
combined with no other rank's (a TP group of one, a ``Recorder(ranks=)`` it is not in, a DP
replica of a 2-D mesh that the user records alone) waits for no one; a rank that records
nothing at all (no ``Recorder``, another pipeline stage's model) is not waited for unless it
holds shards of a recording rank's tensors, i.e. unless it is a peer.

Every ``Recorder.start`` of such a rank writes one row (step, recorded or not, a checksum of the
Recorder's options, its peers) under ``precalign/<root>/<n>/rank<R>`` in the store torch's
default process group was made with (``init_process_group``'s TCPStore) and waits, at most
``PRECALIGN_RANK_WAIT`` seconds (600 unless set), until each of its peers has written its
``n``-th row. Then rows that differ raise one ``RecorderError`` on every rank that read them
(``disagreement``; peers that do not name each other are rows that differ); a peer that never
came (never called ``start()`` for that step, stopped recording early, crashed before it)
raises one ``RecorderError`` on each rank that waited for it, naming the ranks that did not
arrive; a rank that comes after a peer gave up waiting for it raises too.

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
from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, RecorderError

WAIT_VARIABLE = "PRECALIGN_RANK_WAIT"
DEFAULT_WAIT_S = 600.0
_SEQUENCE: dict[str, int] = {}  # per recording root: the checks made on it
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


def agree(root: Path, row: str, said: str, peers: Collection[int]) -> None:
    """Write this rank's ``row`` for the next check on ``root``, wait for each of its ``peers``'
    (module doc); nothing where the rank's records are combined with no other rank's."""
    from torch.distributed.distributed_c10d import _get_default_store

    dist = torch.distributed
    rank, seconds = dist.get_rank(), wait_seconds()
    others = sorted(set(peers) - {rank})
    if not others:
        return
    # The roots in the order this process first checked them: ranks that each record into a
    # root of their own (a folder per rank) still meet, as SPMD code makes its Recorders alike.
    tag = str(_ROOTS.setdefault(str(Path(root).resolve()), len(_ROOTS)))
    n = _SEQUENCE.get(tag, 0)
    _SEQUENCE[tag] = n + 1
    store = _get_default_store()
    key = f"precalign/{tag}/{n}"
    store.set(f"{key}/rank{rank}", f"{row},{'.'.join(str(r) for r in sorted({rank, *others}))}")
    try:
        store.wait([f"{key}/rank{r}" for r in others], timedelta(seconds=seconds))
    except dist.DistStoreError:
        missing = [r for r in others if not store.check([f"{key}/rank{r}"])]
        for r in missing:
            store.set(f"{key}/gave_up/rank{r}", str(rank))
        raise RecorderError(_absent(missing, row, seconds, [rank, *others])) from None
    if store.check([f"{key}/gave_up/rank{rank}"]):
        raise RecorderError(
            f"Recorder: rank {rank} reached start() for step {row.split(',')[0]} after rank "
            f"{store.get(f'{key}/gave_up/rank{rank}').decode()} gave up waiting for it "
            f"({WAIT_VARIABLE}={seconds:g} s)"
        )
    got = [r.decode() for r in store.multi_get([f"{key}/rank{r}" for r in others])]
    rows = {rank: _parsed(f"{row},"), **{r: _parsed(g) for r, g in zip(others, got, strict=True)}}
    apart = [r for r, g in zip(others, got, strict=True) if rank not in _parsed_peers(g)]
    if apart or len(set(rows.values())) > 1:
        raise RecorderError(disagreement(rows, said, apart))
    if n:  # each peer is past check n - 1 (it wrote row n after it): this rank's row n - 1 goes
        store.delete_key(f"precalign/{tag}/{n - 1}/rank{rank}")


def _parsed(row: str) -> tuple[int, int, int]:
    step, selected, digest, _ = row.split(",")
    return int(step), int(selected), int(digest, 16)


def _parsed_peers(row: str) -> set[int]:
    return {int(r) for r in row.rsplit(",", 1)[1].split(".") if r}


def _absent(missing: Sequence[int], row: str, seconds: float, peers: Sequence[int]) -> str:
    step = row.split(",")[0]
    return (
        f"Recorder: ranks {list(missing)} did not reach start() for step {step} within {seconds:g} s "
        f"({WAIT_VARIABLE}); the DTensors' records of a sharded model (FSDP2, tensor parallelism) are "
        f"combined over the ranks that shard them (this rank's: {sorted(peers)}), so each of those "
        "ranks must call start() and stop() on the same steps "
        "(a rank that stopped recording early, crashed or skipped the step)"
    )


def disagreement(rows: Mapping[int, tuple[int, ...]], said: str, apart: Sequence[int] = ()) -> str:
    """The message for ranks whose rows (step, recorded, options checksum), by rank, differ;
    ``apart``: the ranks that do not name this rank among the ranks they shard with."""

    def ranks_where(col: int, value: int) -> list[int]:
        return sorted(r for r, row in rows.items() if row[col] == value)

    first = rows[min(rows)]
    parts = []
    if len({row[0] for row in rows.values()}) > 1:
        parts.append(
            "they are at other steps (" + ", ".join(f"rank {r}: {rows[r][0]}" for r in sorted(rows)) + ")"
        )
    if len({row[1] for row in rows.values()}) > 1:
        parts.append(f"ranks {ranks_where(1, 1)} record this step, ranks {ranks_where(1, 0)} do not (steps=)")
    if len({row[2] for row in rows.values()}) > 1:
        parts.append(
            f"ranks {ranks_where(2, first[2])} and {sorted(r for r, row in rows.items() if row[2] != first[2])} "
            f"were given other Recorder options (this rank's: {said})"
        )
    if apart:
        parts.append(
            f"ranks {sorted(apart)} do not shard their DTensors with this rank, which shards its with them "
            "(other meshes or placements on each rank)"
        )
    return (
        "Recorder: the ranks of this sharded model (DTensor parameters: FSDP2, tensor parallelism) do not "
        f"record alike at step {first[0]}: {'; '.join(parts)}. Their DTensors' records are combined over "
        "the ranks that shard them, so each of those ranks must call start() and stop() on the same steps "
        "with the same options (mode, include, exclude, inputs, grads, params, param_grads, steps)"
    )
