"""One training step's scalars compared between the sides (``StepScalars``), and what a run's
scalars cannot pair (steps on one side only, a scalar one side records, an update one side
skipped): the scalar half of the training-run verdict (``training_run``).

A scalar is judged in the lane of the case: ``exact`` (bitwise equal) or ``approximate``
(``|a - b| <= atol + rtol * |a|`` with the tolerance the case's table gives a record of the
scalar's kind: the loss as a ``loss`` record, the grad norm and clip coefficient as
``param_grad`` records, the parameter norm as a ``param`` record; LRs and weight decays to
``LR_RTOL``; counts, hashes and flags exactly). The update norm is judged only in the exact
lane: AdamW turns noise in near-zero grads into large update differences, so in the
approximate lane the update is judged by its inputs (the parameter records and their grads).
The ``envelope`` lane judges the loss, grad norm, clip coefficient and update and parameter
norms against the noise of clean reruns of the baseline (``training_envelope``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from ..compare.tolerances import ToleranceTable
from ..trace.step_scalars import JOINED_HASH, StepScalars, comparable_hashes
from ..vocabulary import Lane, TrainingClass
from .run_findings import BrokenAlike, RunFinding, ScalarOneSided, StepsOneSided, UpdateSkippedOneSide
from .run_patterns import (
    ClippedDifferently,
    GradNormSummed,
    LrScaledAtStep,
    MicroBatchSplit,
    OnlyOneClipped,
    OtherRows,
    RunPattern,
)
from .scalar_evidence import (
    BatchDiffers,
    ClipDiffers,
    GradNormDiffers,
    GradNormPastForward,
    LossDiffers,
    MicroBatchesCounted,
    OutsideEnvelope,
    RowsDiffer,
    ScalarEvidence,
    ScheduleDiffers,
    ScheduleValuesDiffer,
    TokensDiffer,
    UpdateScalarDiffers,
)
from .training_contract import LR_RTOL
from .training_envelope import ENVELOPE_SCALARS, Envelope
from .training_records import StepRecords

# The table kind each float scalar is judged as, in the approximate lane.
AS_KIND = {
    "loss": ("loss", "forward"),
    "grad_norm": ("param_grad", "backward"),
    "clip_coef": ("param_grad", "backward"),
    "param_norm": ("param", "step"),
}
APPROX_ONLY_EVIDENCE = ("update_norm", "zero_grads")  # not judged in the approximate lane


@dataclass(frozen=True)
class ScalarJudge:
    table: ToleranceTable
    lane: Lane
    dtype: str = "float32"
    envelope: Envelope | None = None  # the envelope lane's (training_envelope)
    forgiven: frozenset[int] = frozenset()  # steps over the envelope that ``steps_over`` allows
    # Both plans normalise the loss per token over the step: another micro-batch split of the
    # same rows is the same loss and grads (not a difference; ``split_free`` in the contract).
    split_free: bool = False

    def same(self, name: str, a: float, b: float, step: int = 0) -> bool:
        if a == b or (math.isnan(a) and math.isnan(b)):
            return True
        if self.lane == "exact":
            return False
        if name in ("lr", "weight_decay"):
            return abs(a - b) <= LR_RTOL * max(abs(a), abs(b))
        if self.envelope is not None and name in ENVELOPE_SCALARS:
            if step in self.forgiven:
                return True
            return abs(a - b) <= self.envelope.allowed(name, step, a, self.bound(name, a, step))
        return abs(a - b) <= self.bound(name, a, step)

    def equal_nan(self, name: str, step: int) -> bool:
        """Whether the table's rule for scalar ``name`` accepts NaN/Inf on both sides."""
        kind, phase = AS_KIND.get(name, ("param", "step"))
        return self.table.lookup(name, kind, phase, self.dtype, step).equal_nan

    def bound(self, name: str, a: float, step: int) -> float:
        """The table's largest |a - b| for scalar ``name`` (as a record of its kind)."""
        kind, phase = AS_KIND.get(name, ("param", "step"))
        tol = self.table.lookup(name, kind, phase, self.dtype, step)
        return tol.atol + tol.rtol * abs(a)


def over_envelope(
    base: Mapping[int, StepScalars], cand: Mapping[int, StepScalars], judge: ScalarJudge
) -> list[int]:
    """The steps at which any scalar the envelope judges is outside it."""
    over = []
    for step in sorted(set(base) & set(cand)):
        for name in ENVELOPE_SCALARS:
            a, b = getattr(base[step], name), getattr(cand[step], name)
            if a is not None and b is not None and not judge.same(name, float(a), float(b), step):
                over.append(step)
                break
    return over


@dataclass(frozen=True)
class ScalarDiff:
    what: TrainingClass
    origin: str
    evidence: ScalarEvidence  # told when rendered (``reports.scalar_evidence_text``)
    pattern: RunPattern | None = None  # told when rendered (``reports.run_pattern_text``)


def first_scalar_difference(base: StepScalars, cand: StepScalars, judge: ScalarJudge) -> ScalarDiff | None:
    """The first scalar of the step that differs, in the order the step computes them."""
    step = base.step
    if comparable_hashes(base.batch_hash, cand.batch_hash) and base.batch_hash != cand.batch_hash:
        assert base.batch_hash is not None and cand.batch_hash is not None
        return ScalarDiff("data", "batch", BatchDiffers(step, base.batch_hash, cand.batch_hash))
    rows = _rows(base, cand)
    if rows is not None:
        return rows
    if base.tokens is not None and cand.tokens is not None and base.tokens != cand.tokens:
        return ScalarDiff("data", "tokens", TokensDiffer(step, base.tokens, cand.tokens))
    if (
        base.micro_batches is not None
        and cand.micro_batches is not None
        and base.micro_batches != cand.micro_batches
        and not judge.split_free
    ):
        pattern = MicroBatchSplit(base.micro_batches, cand.micro_batches)
        counted = MicroBatchesCounted(step, base.micro_batches, cand.micro_batches)
        return ScalarDiff("settings", "micro_batches", counted, pattern)
    for diff in (_loss(base, cand, judge), _grads(base, cand, judge), _clip(base, cand, judge)):
        if diff is not None:
            return _quoted(diff, base, judge)
    return _quoted(_schedule(base, cand, judge) or _update(base, cand, judge), base, judge)


def _rows(base: StepScalars, cand: StepScalars) -> ScalarDiff | None:
    """The step's rows as multisets (``rows_hash``), where the batch hashes cannot tell: a DP
    run's replicas' rows joined against another split (one process), or a side without a batch
    hash. Another order of the same rows within the step is no difference here (a sampler's
    rank split; the loss and the reduced grads are over the rows whatever their order)."""
    if comparable_hashes(base.batch_hash, cand.batch_hash):
        return None
    a, b = base.rows_hash, cand.rows_hash
    if a is None or b is None or a == b:
        return None
    joined = tuple(side for side, s in (("baseline", base), ("candidate", cand)) if _joined(s.batch_hash))
    return ScalarDiff(
        "data",
        "rows",
        RowsDiffer(base.step, joined, a, b),
        OtherRows(),
    )


def _joined(digest: str | None) -> bool:
    return digest is not None and digest.startswith(JOINED_HASH)


def _quoted(diff: ScalarDiff | None, base: StepScalars, judge: ScalarJudge) -> ScalarDiff | None:
    """In the envelope lane, the evidence quotes the envelope the scalar is outside of."""
    if diff is None or judge.envelope is None or diff.origin not in ENVELOPE_SCALARS:
        return diff
    a = float(getattr(base, diff.origin))
    quote = judge.envelope.quote(diff.origin, base.step, a, judge.bound(diff.origin, a, base.step))
    return replace(diff, evidence=OutsideEnvelope(diff.evidence, quote))


def _differs(
    name: str, base: StepScalars, cand: StepScalars, judge: ScalarJudge
) -> tuple[float, float] | None:
    a, b = getattr(base, name), getattr(cand, name)
    if a is None or b is None or judge.same(name, float(a), float(b), base.step):
        return None
    return float(a), float(b)


def _loss(base: StepScalars, cand: StepScalars, judge: ScalarJudge) -> ScalarDiff | None:
    found = _differs("loss", base, cand, judge)
    if found is None:
        return None
    return ScalarDiff("loss", "loss", LossDiffers(*found))


def _grads(base: StepScalars, cand: StepScalars, judge: ScalarJudge) -> ScalarDiff | None:
    found = _differs("grad_norm", base, cand, judge)
    if found is None:
        return None
    a, b = found
    loss = (base.loss, cand.loss)
    moved = loss[0] is not None and loss[1] is not None and loss[0] != loss[1]
    ratio = b / a if a > 0 and b > 0 else 0.0
    big = max(ratio, 1 / ratio) if ratio else 0.0
    if big >= 1.5 and abs(big - round(big)) < 1e-3 * big:
        summed = GradNormDiffers(a, b, "summed")
        return ScalarDiff("grad_reduction", "grad_norm", summed, GradNormSummed(ratio))
    if moved:
        # The loss moved too (within its tolerance): the forward may be where it starts.
        assert loss[0] is not None and loss[1] is not None
        moved_too = GradNormDiffers(a, b, "loss_moved", (loss[0], loss[1]))
        return ScalarDiff("forward_or_backward", "grad_norm", moved_too)
    return ScalarDiff("backward", "grad_norm", GradNormDiffers(a, b, "loss_matched"))


def losses_differ_since(base: Mapping[int, StepScalars], cand: Mapping[int, StepScalars]) -> int | None:
    """The first step whose loss is not bitwise equal on both sides (None: every one is)."""
    for step in sorted(set(base) & set(cand)):
        a, b = base[step].loss, cand[step].loss
        if a is not None and b is not None and a != b:
            return step
    return None


def layers_clear_forward(
    diff: ScalarDiff | None,
    base: StepScalars,
    cand: StepScalars,
    rec: StepRecords,
    lane: Lane,
    since: int | None,
) -> ScalarDiff | None:
    """``_grads``'s ``forward_or_backward`` (the grad norm past its tolerance, the loss moved
    within its own) told ``backward`` where the step's layers clear the forward: its forward
    records compared, none of them and no loss record failed, and the sides' losses already
    differed at an earlier step ``since`` (they do not compute bitwise alike: 1 rank vs 2 sum in
    another order), so a loss within its tolerance is their usual difference, not a forward
    that moved. A rerun bitwise until this step keeps the loss's move as evidence against the
    forward; the envelope lane keeps it too (it judges the grad norm closer than the table
    judges the records). Anything else: ``diff`` as it is."""
    if (
        diff is None
        or diff.what != "forward_or_backward"
        or lane != "approximate"
        or not rec.forwards_compared
        or rec.forward is not None
        or rec.loss is not None
        or since is None
        or since >= base.step
    ):
        return diff
    assert base.grad_norm is not None and cand.grad_norm is not None
    assert base.loss is not None and cand.loss is not None
    losses = (base.loss, cand.loss)
    told = GradNormPastForward(
        base.grad_norm, cand.grad_norm, base.step, rec.forwards_compared, losses, since
    )
    return ScalarDiff("backward", "grad_norm", told)


def _clip(base: StepScalars, cand: StepScalars, judge: ScalarJudge) -> ScalarDiff | None:
    found = _differs("clip_coef", base, cand, judge)
    if found is None:
        return None
    a, b = found
    pattern: RunPattern = ClippedDifferently()
    if a >= 1.0 or b >= 1.0:
        pattern = OnlyOneClipped("candidate" if a >= 1.0 else "baseline", min(a, b))
    return ScalarDiff("clipping", "clip_coef", ClipDiffers(a, b), pattern)


def _schedule(base: StepScalars, cand: StepScalars, judge: ScalarJudge) -> ScalarDiff | None:
    for name in ("lr", "weight_decay"):
        a, b = getattr(base, name), getattr(cand, name)
        if a is None or b is None:
            continue
        if len(a) == len(b):
            pairs = list(zip(a, b, strict=True))
        else:  # other group layouts: compare the values in use
            pairs = (
                list(zip(sorted(set(a)), sorted(set(b)), strict=False)) if len(set(a)) == len(set(b)) else []
            )
            if not pairs:
                in_use = ScheduleValuesDiffer(name, tuple(sorted(set(a))), tuple(sorted(set(b))))
                return ScalarDiff("schedule", name, in_use)
        bad = [(g, x, y) for g, (x, y) in enumerate(pairs) if not judge.same(name, x, y, base.step)]
        if not bad:
            continue
        g, x, y = bad[0]
        evidence = ScheduleDiffers(name, base.step, x, y, g)
        ratios = {round(y2 / x2, 9) for x2, y2 in pairs if x2}
        ratio = ratios.pop() if len(ratios) == 1 else 0.0
        pattern = LrScaledAtStep(ratio) if name == "lr" and ratio > 0 and len(bad) == len(pairs) else None
        return ScalarDiff("schedule", f"{name}[{g}]", evidence, pattern)
    return None


def _update(base: StepScalars, cand: StepScalars, judge: ScalarJudge) -> ScalarDiff | None:
    # The update norm is noise-amplified (module doc): judged where its noise is known or nil.
    names: tuple[Literal["param_norm", "update_norm"], ...] = (
        ("param_norm", "update_norm") if judge.lane in ("exact", "envelope") else ("param_norm",)
    )
    for name in names:
        found = _differs(name, base, cand, judge)
        if found is not None:
            return ScalarDiff("optimizer_update", name, UpdateScalarDiffers(name, *found))
    return None


# ``rows_hash`` is extra evidence of the data (older recordings and hand-made scalars lack it):
# judged where both sides have it, never a finding when one side does not.
_SCALAR_NAMES = tuple(f.name for f in fields(StepScalars) if f.name not in ("step", "rows_hash"))
# The float scalars the verdict judges, in the order a step computes them.
JUDGED = ("loss", "grad_norm", "clip_coef", "lr", "weight_decay", "param_norm", "update_norm")


def nonfinite_on_both(
    base: Mapping[int, StepScalars], cand: Mapping[int, StepScalars], judge: ScalarJudge
) -> tuple[tuple[BrokenAlike, ...], tuple[BrokenAlike, ...]]:
    """``(findings, warnings)`` of the NaN policy: a scalar the verdict judges that is NaN (or
    the same Inf) on both sides is a finding, "loss is nan on both sides from step 2" -- two
    runs broken alike are not aligned, as torch.testing.assert_close's ``equal_nan=False`` --
    unless the table's rule for it says ``equal_nan: true``: then a warning that says so.
    (NaN on one side only is a difference: the step comparison finds it.)"""
    findings: list[BrokenAlike] = []
    warnings: list[BrokenAlike] = []
    common = sorted(set(base) & set(cand))
    for name in JUDGED:
        steps: list[int] = []
        shown: float | None = None
        for step in common:
            a, b = getattr(base[step], name), getattr(cand[step], name)
            if a is None or b is None:
                continue
            pairs = zip(a, b, strict=False) if isinstance(a, tuple) and isinstance(b, tuple) else [(a, b)]
            both = [x for x, y in pairs if _broken_alike(float(x), float(y))]
            if both:
                steps.append(step)
                shown = float(both[0]) if shown is None else shown
        if not steps or shown is None:
            continue
        accepted = judge.equal_nan(name, steps[0])
        told = BrokenAlike(name, shown, steps[0], len(steps), len(common), accepted)
        (warnings if accepted else findings).append(told)
    return tuple(findings), tuple(warnings)


def _broken_alike(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (math.isinf(a) and a == b)


def one_sided(base: Mapping[int, StepScalars], cand: Mapping[int, StepScalars]) -> dict[str, Any]:
    """What one side's scalars hold and the other's do not: ``steps`` (by side, the steps only
    it recorded) and ``scalars`` (by scalar name, then side: the common steps where only that
    side recorded it); empty parts left out."""
    steps = {
        side: sorted(set(mine) - set(other))
        for side, mine, other in (("baseline", base, cand), ("candidate", cand, base))
        if set(mine) - set(other)
    }
    common = sorted(set(base) & set(cand))
    scalars: dict[str, dict[str, list[int]]] = {}
    for name in _SCALAR_NAMES:
        for side, mine, other in (("baseline", base, cand), ("candidate", cand, base)):
            alone = [s for s in common if _one_sided(name, getattr(mine[s], name), getattr(other[s], name))]
            if alone:
                scalars.setdefault(name, {})[side] = alone
    return {k: v for k, v in (("steps", steps), ("scalars", scalars)) if v}


def findings_of(base: Mapping[int, StepScalars], cand: Mapping[int, StepScalars]) -> tuple[RunFinding, ...]:
    """What the two runs' scalars cannot pair: each is a failure of the run, never skipped over."""
    out: list[RunFinding] = []
    lacking = one_sided(base, cand)
    for side, alone in lacking.get("steps", {}).items():
        out.append(StepsOneSided(side, tuple(alone)))
    for name, sides in lacking.get("scalars", {}).items():
        for side, alone in sides.items():
            out.append(ScalarOneSided(name, side, tuple(alone)))
    common = sorted(set(base) & set(cand))
    for s in common:
        a, b = bool(base[s].skipped), bool(cand[s].skipped)
        if a != b:
            out.append(UpdateSkippedOneSide("baseline" if a else "candidate", s))
            break
    return tuple(out)


# What a side that does not have the quantity means by it: no loss scaler is a scale of 1, a
# framework that never skips an update did not skip it.
NEUTRAL: dict[str, object] = {"loss_scale": 1.0, "skipped": False}


def _one_sided(name: str, mine: object, other: object) -> bool:
    return mine is not None and other is None and not (name in NEUTRAL and mine == NEUTRAL[name])
