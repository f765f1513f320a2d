"""Which data-parallel rank's rows diverge, where a record joined from DP replicas
(``parallel.dp_join``) is where a training run first diverges.

A joined activation holds every replica's rows of the global batch in rank order, so a fault on
one rank (a stale parameter after a missing re-gather) shows in the joined record without its
rank. The join kept each replica's rows and statistics (the ``dp_join`` block's ``parts``); the
first divergent module's failing record is checked replica by replica against the other side's
same rows, under the record's own tolerance:

* both sides kept the tensors: each replica's rows of the joined tensor against the same rows
  of the other side's (a one-process run of the global batch, or another DP run);
* statistics only: each replica's statistics against the other side's same replica's, where
  both sides joined the same row split (a rerun of the DP job); against a run split otherwise
  statistics cannot tell the rank, and the evidence says so (record in tensor mode).

The ranks whose rows differ are added to the run verdict's evidence; nothing is claimed where
neither check could run. No torch import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import PurePath

from ..compare.pairs import Comparison, PairResult, array_pair, stats_pair
from ..trace.note_blocks import JoinedPart
from ..trace.records import Record, Stats, Trace
from .run_evidence import RankRows, ReplicaRows, told_with
from .training_run import TrainingVerdict


def with_replica_rows(
    training: TrainingVerdict | None, baseline: Trace, candidate: Trace, comparison: Comparison
) -> TrainingVerdict | None:
    """``training`` with the DP rank(s) whose rows differ in its first divergent module's
    failing record, where that record was joined from DP replicas (module doc)."""
    first = training.first if training is not None else None
    if training is None or first is None or first.what not in ("forward", "backward"):
        return training
    pair = next(
        (
            p
            for p in comparison.pairs
            if p.record.step == first.step
            and p.record.name == first.origin
            and p.candidate is not None
            and not p.passed
            and p.paired
        ),
        None,
    )
    told = replica_rows(pair, baseline, candidate) if pair is not None else None
    if told is None:
        return training
    return replace(training, first=replace(first, evidence=told_with(first.evidence, told)))


def _parts(trace: Trace, rec: Record) -> list[JoinedPart] | None:
    """The replicas ``rec`` was joined from: by its id, or -- a record the mapping renamed (a
    Megatron side in the baseline's names) -- the step's one joined record whose replicas'
    statistics combine exactly to ``rec``'s (max, min, norm: a permutation keeps them)."""
    block = trace.notes.dp_join.get(str(rec.step))
    every = block.parts if block is not None else {}
    parts = every.get(rec.id)
    if parts is None and rec.stats is not None:
        found = [p for p in every.values() if _combine_to(p, rec.stats)]
        parts = found[0] if len(found) == 1 else None
    return list(parts) if parts is not None and len(parts) > 1 else None


def _combine_to(parts: Sequence[JoinedPart], stats: Stats) -> bool:
    got = [p.stats for p in parts if p.stats is not None]
    if len(got) != len(parts):
        return False
    top, low = max(float(g["max"]) for g in got), min(float(g["min"]) for g in got)
    norm = math.sqrt(sum(float(g["norm"]) ** 2 for g in got))
    return top == stats.max and low == stats.min and math.isclose(norm, stats.norm, rel_tol=1e-9)


def rank_name(where: str) -> str:
    """A replica's lead rank folder as the reader knows it (``rank1``), else the folder."""
    name = PurePath(where).name
    return name if name.startswith("rank") else where


def replica_rows(pair: PairResult, baseline: Trace, candidate: Trace) -> ReplicaRows | None:
    """What each DP replica's rows of ``pair`` say (module doc); None when neither side joined
    replicas for this record (no ranks: statistics cannot tell them)."""
    a, b = pair.record, pair.candidate
    assert b is not None
    pa, pb = _parts(baseline, a), _parts(candidate, b)
    split = pb if pb is not None else pa
    if split is None or pair.tolerance is None or a.shape != b.shape or not a.shape:
        return None
    side = "candidate" if pb is not None else "baseline"
    rows = [p.rows for p in split]
    dim = split[0].dim  # the batch dim as joined (a mapping may have moved it since)
    results: list[PairResult] | None
    if (
        baseline.has_tensor(a)
        and candidate.has_tensor(b)
        and dim < len(a.shape)
        and sum(rows) == a.shape[dim]
    ):
        results = _by_arrays(pair, baseline, candidate, rows, dim)
    elif pa is not None and pb is not None and [p.rows for p in pa] == rows:
        results = _by_stats(pair, pa, pb)
        if results is None:
            return None
    else:
        return ReplicaRows(side)
    return _told(split, rows, results, side)


def _by_arrays(
    pair: PairResult, baseline: Trace, candidate: Trace, rows: Sequence[int], dim: int
) -> list[PairResult]:
    a, b = pair.record, pair.candidate
    assert b is not None and pair.tolerance is not None
    xa, xb = baseline.array(a), candidate.array(b)
    out, at = [], 0
    for n in rows:
        shape = (*a.shape[:dim], n, *a.shape[dim + 1 :])
        ra, rb = (replace(r, shape=shape) for r in (a, b))
        take = (slice(None),) * dim + (slice(at, at + n),)
        out.append(array_pair(ra, rb, xa[take], xb[take], pair.tolerance))
        at += n
    return out


def _by_stats(
    pair: PairResult, pa: Sequence[JoinedPart], pb: Sequence[JoinedPart]
) -> list[PairResult] | None:
    a, b = pair.record, pair.candidate
    assert b is not None and pair.tolerance is not None
    out = []
    for x, y in zip(pa, pb, strict=True):
        if x.stats is None or y.stats is None:
            return None
        numel = a.numel * x.rows // sum(p.rows for p in pa)  # its share (the norm's atol)
        ra = replace(a, shape=(numel,), stats=_stats(x.stats))
        rb = replace(b, shape=(numel,), stats=_stats(y.stats))
        out.append(stats_pair(ra, rb, pair.tolerance))
    return out


def _stats(of: Mapping[str, float]) -> Stats:
    """A replica's statistics as the join kept them (``JoinedPart.stats``)."""
    return Stats(of["max"], of["min"], of["mean"], of["norm"], int(of.get("nan", 0)), int(of.get("inf", 0)))


def _told(
    split: Sequence[JoinedPart], rows: Sequence[int], results: Sequence[PairResult], side: str
) -> ReplicaRows:
    ranks, at = [], 0
    for part, n, result in zip(split, rows, results, strict=True):
        check = result.failing
        failing = (check.metric, check.value, check.allowed) if check is not None else None
        ranks.append(RankRows(rank_name(part.where), at, n, failing, result.passed))
        at += n
    return ReplicaRows(side, tuple(ranks))
