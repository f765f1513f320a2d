"""The per-step scalars of a data-parallel run's replicas -> the run's global scalars.

Each rank records its own step's scalars (``Recorder.record_scalars``). Where the replicas
trained on different rows (``dp_join``), the global step is: ``loss`` the mean of the
replicas' losses weighted by their ``tokens`` when every replica records them (the loss of
the one-process run over the global batch, normalised per token), else their plain mean
(equal shares, as ``DistributedSampler`` gives); ``tokens`` their sum; ``batch_hash`` the replicas' hashes marked as such (``JOINED_HASH``:
the global batch's sha256 is not a function of the shards'; compared only with another DP
run's), ``rows_hash`` their sum (the global batch's rows as a multiset, comparable with a
one-process run's: ``StepScalars.rows_hash``).
What the reduction and the optimizer make the same on every replica -- the LR and weight
decay, the grad norm and clip coefficient after the reduction, the update and parameter
norms, the count of zero grads, a skipped step, the loss scale, the micro-batch count -- must
be: a replica that differs is a finding naming its rank and the step (a grad norm taken on
one rank's shard only, an LR changed on one rank), and replica 0's value is kept. Replicas
that saw the same data must agree on the loss too. No torch import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import TraceError
from ..trace.note_blocks import ReplicaMismatch
from ..trace.step_scalars import JOINED_HASH, StepScalars, add_rows_hashes

AGREE = (
    "lr",
    "weight_decay",
    "grad_norm",
    "clip_coef",
    "update_norm",
    "param_norm",
    "zero_grads",
    "loss_scale",
    "skipped",
    "micro_batches",
)


def loss_weights(scalars: Sequence[StepScalars | None]) -> list[float]:
    """Each replica's share of the global loss: its tokens over all, when every replica
    recorded a positive token count; else equal shares."""
    tokens = [s.tokens if s is not None else None for s in scalars]
    if all(t is not None and t > 0 for t in tokens):
        total = sum(t for t in tokens if t is not None)
        return [t / total for t in tokens if t is not None]
    return [1.0 / len(scalars)] * len(scalars)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _finding(field: str, step: int, kept: str, differ: list[tuple[str, Any]], value: Any) -> ReplicaMismatch:
    return ReplicaMismatch(
        record=f"scalars|{field}|{step}",
        name=f"step scalar {field}",
        kind="scalar",
        phase="step",
        step=step,
        kept=kept,
        differ=tuple(w for w, _ in differ),
        detail=f"{differ[0][1]!r} vs {value!r}",
    )


def join_scalars(
    manifests: Sequence[tuple[str, Mapping[int, StepScalars]]], *, joined: bool
) -> tuple[dict[int, StepScalars] | None, list[ReplicaMismatch]]:
    """(the run's scalars, findings) from the replicas' lead traces' scalars (``(where,
    scalars)``, replica 0 first). ``joined``: the replicas trained on different rows. None
    when replica 0 recorded no scalars."""
    per = [scalars for _, scalars in manifests]
    if not per[0]:
        return None, []
    findings: list[ReplicaMismatch] = []
    out: dict[int, StepScalars] = {}
    lead = manifests[0][0]
    for step, first in per[0].items():
        held = [p.get(step) for p in per]
        lacking = [manifests[i][0] for i, s in enumerate(held) if s is None]
        if lacking:
            raise TraceError(
                f"{lacking[0]}: no scalars of step {step}, which {lead} recorded; every DP replica "
                "records each step's scalars (Recorder.record_scalars on every rank)"
            )
        others = [(manifests[i][0], s) for i, s in enumerate(held) if i and s is not None]
        fields = AGREE if joined else (*AGREE, "loss", "tokens", "batch_hash", "rows_hash")
        for name in fields:
            value = getattr(first, name)
            differ = [(w, getattr(s, name)) for w, s in others if not _same(getattr(s, name), value)]
            if differ:
                findings.append(_finding(name, step, lead, differ, value))
        if joined:
            everyone = [s for s in held if s is not None]
            first = _global(first, everyone)
        out[step] = first
    return out, findings


def _global(first: StepScalars, everyone: Sequence[StepScalars]) -> StepScalars:
    weights = loss_weights(everyone)
    losses = [s.loss for s in everyone]
    loss = None
    if all(v is not None for v in losses):
        loss = sum(w * v for w, v in zip(weights, losses, strict=True) if v is not None)
    tokens = [s.tokens for s in everyone]
    total = sum(t for t in tokens if t is not None) if all(t is not None for t in tokens) else None
    hashes = [s.batch_hash for s in everyone]
    digest = first.batch_hash
    if len(set(hashes)) > 1 and all(h is not None for h in hashes):
        digest = JOINED_HASH + ",".join(h[:16] for h in hashes if h is not None)
    rows = [s.rows_hash for s in everyone]
    joined_rows = add_rows_hashes([r for r in rows if r is not None]) if None not in rows else None
    return replace(first, loss=loss, tokens=total, batch_hash=digest, rows_hash=joined_rows)
