"""What a data-parallel run's replicas disagreed on, in the training verdict.

Replicas hold the same parameters after each step and the same reduced grads, LR, grad norm,
clip coefficient and update (``parallel.dp_join``, ``parallel.dp_scalars``); where they do not,
the merge noted each disagreement (``replica_mismatches``: the step, what, the ranks). The
first step with one is where the run's ranks stopped being one training: when no earlier step
diverged from the other side, it is the first divergent step, its class that of what the
replicas disagree on first in the step's order -- a grad norm taken on one rank's shard is
clipping, an LR changed on one rank the schedule, parameters that differ with nothing else the
optimizer's update -- named with the ranks that differ. No torch import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..trace.note_blocks import ReplicaMismatch
from ..vocabulary import TrainingClass
from .run_evidence import ReplicasDisagree
from .training_run import FirstDivergent, TrainingVerdict

# A step's scalars in the order the step computes them, and the class each one's disagreement is.
SCALAR_CLASSES: dict[str, TrainingClass] = {
    "batch_hash": "data",
    "tokens": "data",
    "rows_hash": "data",
    "micro_batches": "settings",
    "loss": "loss",
    "zero_grads": "backward",
    "grad_norm": "clipping",
    "clip_coef": "clipping",
    "lr": "schedule",
    "weight_decay": "schedule",
    "loss_scale": "optimizer_update",
    "skipped": "optimizer_update",
    "update_norm": "optimizer_update",
    "param_norm": "optimizer_update",
}
_PREFIX = "step scalar "


def with_replica_findings(
    training: TrainingVerdict, mismatches: Sequence[ReplicaMismatch]
) -> TrainingVerdict:
    """``training`` with the replicas' first disagreement as its first divergence, where no
    earlier step diverged (module doc)."""
    steps = [m.step for m in mismatches]
    if not steps:
        return training
    k = min(steps)
    first = training.first
    if first is not None and first.step < k:
        return training
    at = [m for m in mismatches if m.step == k]
    order = list(SCALAR_CLASSES)
    scalars = sorted(
        (m for m in at if m.kind == "scalar" and m.name[len(_PREFIX) :] in SCALAR_CLASSES),
        key=lambda m: order.index(m.name[len(_PREFIX) :]),
    )
    if scalars:
        m = scalars[0]
        name = m.name[len(_PREFIX) :]
        found = FirstDivergent(k, SCALAR_CLASSES[name], name, ReplicasDisagree(m, name))
    elif first is None or first.step > k:
        m = at[0]
        kinds: dict[str, TrainingClass] = {"param": "optimizer_update", "param_grad": "grad_reduction"}
        fallback: TrainingClass = "backward" if m.phase == "backward" else "forward"
        what = kinds.get(m.kind, fallback)
        found = FirstDivergent(k, what, m.name, ReplicasDisagree(m))
    else:
        return training
    return replace(training, first=found)
