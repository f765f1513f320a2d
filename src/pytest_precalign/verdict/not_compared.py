"""What a run verdict did not compare, as facts (``TrainingVerdict.not_compared``); the words
are made when the verdict is rendered (``reports.not_compared_text``). No torch import.

- ``LayersOneSide``: the layers of steps one side recorded while the other recorded only those
  steps' scalars.
- ``RowsSplit``: a step whose module calls hold other rows on the two sides (one side joined
  DP replicas: ``parallel.dp_join.split_rows``).
- ``MicroBatchSplit``: steps the sides split into other micro-batches.
- ``KindsNotRecorded``: kinds of record a side could not take at all, and why (its ``compiled``
  note: ``run.both_recorded.not_recorded_kinds``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LayersOneSide:
    side: str  # the side that recorded them
    steps: tuple[int, ...]


@dataclass(frozen=True)
class RowsSplit:
    step: str  # as the ``dp_split`` note keys it
    how: str  # how each side split the step's rows (the note's reason)


@dataclass(frozen=True)
class MicroBatchSplit:
    steps: tuple[int, ...]


@dataclass(frozen=True)
class KindsNotRecorded:
    kinds: tuple[str, ...]  # the kinds that share ``why``
    side: str
    why: str


NotCompared = LayersOneSide | RowsSplit | MicroBatchSplit | KindsNotRecorded


def not_compared(
    alone: Mapping[str, Sequence[int]],
    split: Sequence[int] = (),
    rows: Mapping[str, str] | None = None,
    kinds: Mapping[str, KindsNotRecorded] | None = None,
) -> tuple[NotCompared, ...]:
    """What was not compared because one side lacks it (``alone``: side -> steps; ``kinds``:
    kind -> why one side could not take it) or the sides split it into other micro-batches
    (``split``; ``rows``: step -> how each side split it, where one side joined DP replicas)."""
    facts: list[NotCompared] = [LayersOneSide(side, tuple(steps)) for side, steps in alone.items()]
    rows = rows or {}
    facts += [RowsSplit(step, how) for step, how in rows.items()]
    split = [s for s in split if str(s) not in rows]
    if split:
        facts.append(MicroBatchSplit(tuple(split)))
    return (*facts, *dict.fromkeys((kinds or {}).values()))  # kinds with one reason: one fact
