"""What an overflow of the candidate's module outputs was seen as, in words (the verdict holds
the fact: ``verdict.overflow.Overflow``), as the terminal and report.json say it."""

from __future__ import annotations

from ..verdict.overflow import BLOWUP, Overflow

_SEEN = {
    "made": "finite inputs, non-finite output",
    "passed_on": "inputs and output non-finite",
    "masked": "a non-finite input, finite output",
}


def overflow_why(o: Overflow) -> str:
    """``finite inputs, non-finite output``, ``output norm 1.2e+06 > 10000 x input norm``."""
    if o.seen == "blown_up":
        norm = o.record.stats.norm if o.record.stats is not None else float("nan")
        return f"output norm {norm:.3g} > {BLOWUP:g} x input norm"
    return _SEEN[o.seen]
