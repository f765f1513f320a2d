"""Frozen parameters (a LoRA run's base weights: the manifest's ``training.frozen``, read by
``case_facts``) are checked to stay unchanged instead of being judged at every step.

A parameter both sides freeze cannot tell the sides apart while it stays as it was: its
records are taken out of the comparison (``without_frozen``: they are not judged evidence of a
step), and each side's own records of it are checked against each other, step after step, and
against its ``initial_params`` summary (``frozen_changes``): a frozen parameter that changed is
a finding naming it, the side and the step. The check is exact between steps (the same
statistics of the same values, the same CRC, the same tensor) and, against the initial
summary (computed in float64, the records' in the parameter's dtype), exact on max and min and
within ``SUMMARY_RTOL`` on the norm. A parameter one side trains is compared as usual.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..compare.pairs import Comparison
from ..trace.records import Record, Trace
from .run_findings import FrozenChanged

SUMMARY_RTOL = 1e-5  # a float32 reduction against the same one in float64


def without_frozen(comparison: Comparison, frozen: Iterable[str]) -> Comparison:
    """``comparison`` without the parameter records of ``frozen`` (frozen on both sides)."""
    names = frozenset(frozen)
    if not names:
        return comparison
    kept = tuple(p for p in comparison.pairs if not (p.record.kind == "param" and p.record.name in names))
    return replace(comparison, pairs=kept)


def frozen_changes(
    trace: Trace, frozen: Iterable[str], side: str, initial: Mapping[str, Mapping[str, float]] | None
) -> list[FrozenChanged]:
    """A finding for each frozen parameter whose records change (see the module doc);
    ``initial``: the side's ``initial_params`` summaries."""
    names = frozenset(frozen)
    records: dict[str, list[Record]] = {}
    for rec in trace.records:
        if rec.kind == "param" and rec.name in names:
            records.setdefault(rec.name, []).append(rec)
    out: list[FrozenChanged] = []
    for name in sorted(records):
        seen = sorted(records[name], key=lambda r: (r.step, r.call))
        summary = (initial or {}).get(name)
        if isinstance(summary, Mapping) and seen[0].stats is not None and not _like_initial(seen[0], summary):
            stats = seen[0].stats
            assert stats is not None
            initial_norm = float(summary.get("norm", float("nan")))
            out.append(FrozenChanged(name, side, seen[0].step, None, initial_norm, stats.norm))
            continue
        for before, after in zip(seen, seen[1:], strict=False):
            if not _same(trace, before, after):
                out.append(FrozenChanged(name, side, after.step, before.step))
                break
    return out


def _same(trace: Trace, a: Record, b: Record) -> bool:
    if a.stats is not None and b.stats is not None:
        return a.stats == b.stats
    if a.crc32 is not None and b.crc32 is not None:
        return a.crc32 == b.crc32
    if trace.has_tensor(a) and trace.has_tensor(b):
        return bool(np.array_equal(np.asarray(trace.array(a)), np.asarray(trace.array(b))))
    return True  # nothing to compare by: no finding without evidence


def _like_initial(rec: Record, summary: Mapping[str, Any]) -> bool:
    stats = rec.stats
    assert stats is not None
    try:
        norm = float(summary["norm"])
        exact = stats.max == float(summary["max"]) and stats.min == float(summary["min"])
        return exact and abs(stats.norm - norm) <= SUMMARY_RTOL * abs(norm)
    except (KeyError, TypeError, ValueError):
        return True  # a summary without these numbers: nothing to compare by
