"""Parameter grads one side of a training run has at a step and the other has not: that
side's backward never reached those parameters (frozen there, or cut from its graph, e.g.
reentrant gradient checkpointing with inputs that do not require grad: transformers #21381).

A grad counts as one-sided only after the mapping paired the sides: its name (the candidate's
brought to the baseline's by the mapping, fused parameters split or joined) has no grad record
on the other side at that step at all, and the mapping gave no reason for it. A parameter
whose grad both sides record at a different granularity (each micro-batch's accumulation on
one, once per step on the other: ``Recorder(param_grads=...)``) is not one-sided: its calls
differ, not its presence.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..compare.pairs import PairResult


def one_sided_grads(pairs: Sequence[PairResult]) -> tuple[tuple[str, str], ...]:
    """One step's parameter grads recorded on one side only, as (name, the side that has
    it), in record order, each name once."""
    grads = [p for p in pairs if p.record.kind == "param_grad"]
    held = {
        "baseline": {p.record.name for p in grads if p.status != "only_candidate"},
        "candidate": {(p.candidate or p.record).name for p in grads if p.status != "only_baseline"},
    }
    side = {"only_baseline": "baseline", "only_candidate": "candidate"}
    out: dict[str, str] = {}
    for p in sorted(grads, key=lambda p: p.record.seq):
        if p.status not in side or p.note:
            continue
        other = "candidate" if side[p.status] == "baseline" else "baseline"
        if p.record.name not in held[other]:
            out.setdefault(p.record.name, side[p.status])
    return tuple(out.items())
