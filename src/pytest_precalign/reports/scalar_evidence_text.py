"""Why a step's scalars differ, in words, made when the verdict is rendered (the verdict holds
the facts: ``verdict.scalar_evidence``)."""

from __future__ import annotations

from ..trace.step_scalars import JOINED_HASH
from ..verdict import scalar_evidence

_GRAD_NORM_TAIL = {
    "summed": " while the loss matched",
    "loss_matched": " while the loss matched; record layers to find where in the backward",
}
_UPDATE = {"param_norm": "parameter norm after", "update_norm": "norm of"}


def scalar_evidence_text(fact: scalar_evidence.ScalarEvidence) -> str:
    """One step scalar's difference, in words."""
    match fact:
        case scalar_evidence.BatchDiffers(step, a, b):
            return f"the batch of step {step} differs ({_hashes(a, b)})"
        case scalar_evidence.RowsDiffer(step, joined, a, b):
            how = f" (the {' and '.join(joined)}'s DP replicas' rows joined)" if joined else ""
            return (
                f"the rows of step {step} differ{how}: other rows, not only another order or split "
                f"(multiset hash {a[:12]} vs {b[:12]})"
            )
        case scalar_evidence.TokensDiffer(step, a, b):
            return f"tokens in step {step}: {a} vs {b}"
        case scalar_evidence.MicroBatchesCounted(step, a, b):
            return f"micro_batches in step {step}: the sides split the step into {a} and {b} micro-batches"
        case scalar_evidence.LossDiffers(a, b):
            return f"loss {_num(a)} vs {_num(b)}"
        case scalar_evidence.GradNormDiffers(a, b, how, losses):
            head = f"grad norm (before clipping) {_num(a)} vs {_num(b)}"
            if how == "loss_moved":
                return (
                    f"{head}, and the loss moved too ({losses[0]!r} vs {losses[1]!r}, within its tolerance): "
                    "the forward or the backward; record layers to find where"
                )
            return head + _GRAD_NORM_TAIL[how]
        case scalar_evidence.GradNormPastForward():
            return _past_forward(fact)
        case scalar_evidence.ClipDiffers(a, b):
            return f"clip coefficient {_num(a)} vs {_num(b)} with the grad norm matching"
        case scalar_evidence.ScheduleValuesDiffer(name, a, b):
            return f"{name} values in use: {list(a)} vs {list(b)}"
        case scalar_evidence.ScheduleDiffers(name, step, a, b, group):
            return f"{name} at step {step}: {a:.3e} vs {b:.3e} (group {group})"
        case scalar_evidence.UpdateScalarDiffers(name, a, b):
            return f"{_UPDATE[name]} the update {_num(a)} vs {_num(b)} while its inputs matched"
    assert isinstance(fact, scalar_evidence.OutsideEnvelope)
    return f"{scalar_evidence_text(fact.evidence)}; {_quote(fact.quote)}"


def _past_forward(fact: scalar_evidence.GradNormPastForward) -> str:
    return (
        f"grad norm (before clipping) {_num(fact.a)} vs {_num(fact.b)} while every forward "
        f"record of step {fact.step} matched ({fact.compared} compared); the loss moved within its "
        f"tolerance ({fact.losses[0]!r} vs {fact.losses[1]!r}) as the sides' losses have since step "
        f"{fact.since} (they do not compute bitwise alike): the backward -- the parameter grads, their "
        "reduction or the norm's own computation (no recorded grad of the step differs)"
    )


def _quote(q: scalar_evidence.EnvelopeQuote) -> str:
    floor = "the table's bound" if q.floor is None else f"floor {q.floor:g} x |baseline|"
    return (
        f"noise envelope: {q.name} spread {q.spread:.3g} over {q.reruns} clean rerun(s) of the "
        f"baseline, allowed {q.allowed:.3g} (max of {q.factor:g} x spread, {floor})"
    )


def _num(x: float) -> str:
    return f"{x:.6g}"


def _hashes(a: str, b: str) -> str:
    """Two batch hashes in words: DP replicas' (``JOINED_HASH``) replica by replica."""
    if not a.startswith(JOINED_HASH):
        return f"sha256 {a[:12]} vs {b[:12]}"
    mine, theirs = (h[len(JOINED_HASH) :].split(",") for h in (a, b))
    if len(mine) != len(theirs):
        return f"{len(mine)} vs {len(theirs)} DP replicas"
    differ = [
        f"replica {i}: sha256 {x[:12]} vs {y[:12]}"
        for i, (x, y) in enumerate(zip(mine, theirs, strict=True))
        if x != y
    ]
    return "DP " + "; ".join(differ)
