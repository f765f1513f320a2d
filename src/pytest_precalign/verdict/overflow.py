"""Overflow levels of the candidate's module outputs (seed 001): where NaN/Inf appear or a
norm blows up, and whether the module made it or received it.

* ``critical``: the inputs were finite, the output is not (the module made the overflow);
* ``high``: inputs and output both non-finite, or a finite output whose norm is more than
  ``BLOWUP`` times its largest input norm and whose values exceed ``LARGE``;
* ``medium``: an input was non-finite, the output is finite again (e.g. masked away).

Each holds what was seen as a fact (``Overflow.seen``); the words are made when rendered
(``reports.overflow_text``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from ..trace.records import Record

BLOWUP = 1e4  # output norm / largest input norm
LARGE = 1e4  # and an output magnitude this large: rsqrt of a small variance is not an overflow
LEVELS = ("critical", "high", "medium")


OverflowLevel = Literal["critical", "high", "medium"]
# What was seen: finite inputs and a non-finite output (``made``), non-finite inputs and output
# (``passed_on``), a non-finite input and a finite output (``masked``), an output norm over
# ``BLOWUP`` times the largest input norm (``blown_up``: the record's norm).
OverflowSeen = Literal["made", "passed_on", "masked", "blown_up"]


@dataclass(frozen=True)
class Overflow:
    record: Record
    level: OverflowLevel
    seen: OverflowSeen


def _bad(record: Record) -> bool:
    return record.stats is not None and not record.stats.finite


def overflow_levels(records: Iterable[Record], by_id: Mapping[str, Record]) -> tuple[Overflow, ...]:
    """Module outputs of one side with an overflow level, in execution order."""
    out = []
    for rec in records:
        if rec.kind != "activation" or rec.stats is None:
            continue
        inputs = [by_id[d] for d in rec.deps if d in by_id and by_id[d].stats is not None]
        inputs_bad = any(_bad(i) for i in inputs)
        if _bad(rec):
            out.append(
                Overflow(rec, "high", "passed_on") if inputs_bad else Overflow(rec, "critical", "made")
            )
        elif inputs_bad:
            out.append(Overflow(rec, "medium", "masked"))
        else:
            norms = [i.stats.norm for i in inputs if i.stats is not None and i.stats.norm == i.stats.norm]
            peak = max(abs(rec.stats.max), abs(rec.stats.min))
            if norms and peak > LARGE and rec.stats.norm > BLOWUP * max(max(norms), 1e-30):
                out.append(Overflow(rec, "high", "blown_up"))
    return tuple(out)
