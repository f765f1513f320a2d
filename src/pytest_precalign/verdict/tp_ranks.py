"""Which tensor-parallel rank's share is wrong, where a run first diverges in the forward at a
``RowwiseParallel`` module (issue #45).

Such a module's output is all-reduced, so every rank records the same sum and a fault in one
rank's share shows without its rank. Each rank kept its partial sum's statistics before the
all-reduce (the ``tp_partials`` note, ``steps/tp_partials.py``). Where both sides kept them
for the same ranks and calls (a rerun of the same TP layout, a golden of it), each rank's are
compared with the other side's same rank's; the ranks whose partial sums differ are added to the
run verdict's evidence, or, where none differs, that the ranks' shares agree and the reduction
differs. Against a side without them (one process, another layout) the evidence says in one
line why the rank cannot be told. Nothing is claimed without evidence. No torch import.

Where a run first diverges elsewhere (the backward, the grads, the update) at a module, or a
parameter, whose sharded weights' grads the ranks kept as local shards (the ``tp_grad_shards``
note, ``steps/tp_partials.py``: a ``ColwiseParallel`` / ``RowwiseParallel`` weight), each rank's
shard is compared with the other side's same rank's the same way: "TP rank1: its local shard of
<param>'s grad differs ...". Against a side without them, the one line why not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..trace.note_blocks import PartialSums
from ..trace.records import Trace
from .run_evidence import TpShares, told_with
from .training_run import TrainingVerdict

RTOL = 1e-3  # of the partial sums' statistics: far above the rounding of one layout on any CPU


def with_tp_rank(
    training: TrainingVerdict | None, baseline: Trace, candidate: Trace
) -> TrainingVerdict | None:
    """``training`` with the TP rank(s) whose partial sum differs at its first divergent
    forward module, where that module's ranks kept partial sums (module doc)."""
    first = training.first if training is not None else None
    if training is None or first is None or not first.origin:
        return training
    if first.what != "forward":
        return _with_grad_shards(training, baseline, candidate)
    sides = [_partials(t, first.step, first.origin) for t in (baseline, candidate)]
    if sides == [None, None]:
        return training
    told = partial_sums(sides[0], sides[1], first.origin)
    return replace(training, first=replace(first, evidence=told_with(first.evidence, told)))


def _with_grad_shards(training: TrainingVerdict, baseline: Trace, candidate: Trace) -> TrainingVerdict:
    """``training`` with the TP ranks whose local grad shards of its origin's sharded weights
    differ (module doc); as it is where neither side kept them."""
    first = training.first
    assert first is not None and first.origin
    origin, step = first.origin, str(first.step)
    kept = [t.notes.tp_grad_shards.get(step) for t in (baseline, candidate)]
    shards = [side.modules if side is not None else {} for side in kept]
    params = sorted({p for side in shards for p in side if p == origin or p.startswith(f"{origin}.")})
    if not params:
        return training
    told = [partial_sums(shards[0].get(p) or None, shards[1].get(p) or None, p, grads=True) for p in params]
    return replace(training, first=replace(first, evidence=told_with(first.evidence, *told)))


Ranks = Mapping[str, Sequence[PartialSums | Sequence[float]]]  # TP rank -> one entry a call


def _partials(trace: Trace, step: int, origin: str) -> Ranks | None:
    block = trace.notes.tp_partials.get(str(step))
    return block.of(origin) if block is not None else None


def partial_sums(base: Ranks | None, cand: Ranks | None, origin: str, grads: bool = False) -> TpShares:
    """Two sides' partial sums of ``origin`` (rank -> one list per call) compared rank by rank;
    ``grads``: of their local shards of the grad of the parameter ``origin``."""
    cannot = TpShares(origin, grads, None, RTOL)
    if base is None or cand is None or set(base) != set(cand):
        return cannot
    differ, compared = [], 0
    for rank in sorted(cand, key=int):
        a, b = base[rank], cand[rank]
        if len(a) != len(b):
            return cannot
        pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
        compared += len(pairs)
        if any(not _close(x, y) for x, y in pairs):
            differ.append(f"rank{rank}")
    return TpShares(origin, grads, tuple(differ), RTOL) if compared else cannot


def _close(a: Sequence[float], b: Sequence[float]) -> bool:
    scale = max(abs(a[3]), abs(b[3]), 1e-12)  # the norm: a sum near zero is judged against it
    return all(abs(x - y) <= RTOL * max(abs(x), abs(y), scale * 1e-2) for x, y in zip(a, b, strict=True))
