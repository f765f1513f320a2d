"""Overflow levels of the candidate's module outputs (seed 001): where NaN/Inf appear or a
norm blows up, and whether the module made it or received it.

* ``critical``: the inputs were finite, the output is not (the module made the overflow);
* ``high``: inputs and output both non-finite, or a finite output whose norm is more than
  ``BLOWUP`` times its largest input norm and whose values exceed ``LARGE``;
* ``medium``: an input was non-finite, the output is finite again (e.g. masked away).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..trace.records import Record

BLOWUP = 1e4  # output norm / largest input norm
LARGE = 1e4  # and an output magnitude this large: rsqrt of a small variance is not an overflow
LEVELS = ("critical", "high", "medium")


@dataclass(frozen=True)
class Overflow:
    record: Record
    level: str
    why: str


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
            level = "high" if inputs_bad else "critical"
            why = "inputs and output non-finite" if inputs_bad else "finite inputs, non-finite output"
            out.append(Overflow(rec, level, why))
        elif inputs_bad:
            out.append(Overflow(rec, "medium", "a non-finite input, finite output"))
        else:
            norms = [i.stats.norm for i in inputs if i.stats is not None and i.stats.norm == i.stats.norm]
            peak = max(abs(rec.stats.max), abs(rec.stats.min))
            if norms and peak > LARGE and rec.stats.norm > BLOWUP * max(max(norms), 1e-30):
                out.append(
                    Overflow(rec, "high", f"output norm {rec.stats.norm:.3g} > {BLOWUP:g} x input norm")
                )
    return tuple(out)
