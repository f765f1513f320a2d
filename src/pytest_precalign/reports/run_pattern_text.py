"""A training run verdict's whole-model pattern in words (``FirstDivergent.pattern``, facts in
``verdict.run_patterns``), made when the verdict is rendered; "" for none."""

from __future__ import annotations

from ..verdict.run_patterns import (
    AdapterOneSided,
    ClippedDifferently,
    ClippedPerMicroBatch,
    DecayHorizon,
    DecayOneSided,
    EveryParamUpdated,
    GradNormOverOthers,
    GradNormSummed,
    GradsChangedAfterBackward,
    GradsOnOneSide,
    GradsScaledBy,
    LossFunctionDiffers,
    LossGradScaled,
    LrScaledAtStep,
    MicroBatchSplit,
    OnlyOneClipped,
    OtherRows,
    RunPattern,
    ScheduleScaled,
    ScheduleShifted,
)


def pattern_text(pattern: RunPattern | None) -> str:
    """The pattern's sentence ("" when there is none)."""
    match pattern:
        case None:
            return ""
        case LossFunctionDiffers():
            return "the loss function differs: its value can coincide at a step, its gradient does not"
        case LossGradScaled(factor):
            return (
                f"every grad scaled by one factor (x{factor:.4g}) from the model's output on: the loss's "
                "gradient is scaled (a loss scale not undone, or a factor applied in its backward only)"
            )
        case GradsScaledBy(factor):
            return f"every grad scaled by one factor (x{factor:.4g}): a loss scale, or grads summed instead of averaged"
        case GradsOnOneSide():
            return (
                "parameters that get a grad on one side only: not trainable there, or cut from its graph "
                "(inputs detached or not requiring grad, e.g. under reentrant gradient checkpointing)"
            )
        case ClippedPerMicroBatch(late, early):
            return (
                f"only the {late} clipped at the update; the {early}'s grads changed between the "
                "backward and the update: it clipped each micro-batch's grads before accumulating them"
            )
        case GradsChangedAfterBackward():
            return "the grads changed after the backward: their accumulation, reduction or precision"
        case GradNormOverOthers():
            return "the grad norm is computed over other grads or parameters than the other side's"
        case EveryParamUpdated(count):
            return f"every parameter ({count}) differs after the update while its grad matched"
        case _:
            return _scalar_pattern_text(pattern)


def _scalar_pattern_text(pattern: RunPattern) -> str:
    """The patterns a step's scalars or the plans show."""
    match pattern:
        case MicroBatchSplit(base, cand, planned):
            return f"the sides split {'each' if planned else 'the'} step into {base} and {cand} micro-batches"
        case GradNormSummed(factor):
            return (
                f"the grad norm is x{factor:.4g}: grads summed instead of averaged (ranks or micro-batches)"
            )
        case OnlyOneClipped(side, factor):
            return f"only the {side} clipped: every grad scaled by one factor ({factor:.6g})"
        case ClippedDifferently():
            return "both clipped, by different factors: another threshold or norm"
        case LrScaledAtStep(factor):
            return f"every parameter moved by the same factor (LR x{factor:.4g}): the LR differs"
        case DecayOneSided(candidate):
            if candidate:
                return "weight decay on parameters the baseline does not decay"
            return "no weight decay on parameters the baseline decays"
        case ScheduleShifted(lag, behind):
            return f"the candidate's schedule is {lag} step(s) {'behind' if behind else 'ahead of'} the baseline's"
        case ScheduleScaled(factor):
            return f"every step's LR scaled by {factor:.4g}"
        case OtherRows():
            return (
                "the sides trained other rows at this step: another sampler order (a shuffle on one side, "
                "each DP rank shuffling its own), or other data"
            )
        case AdapterOneSided():
            return "one side trains an adapter the other has not"
        case DecayHorizon(base_end, cand_end):
            return f"same peak, the decay ends {_at(cand_end)} vs {_at(base_end)}: another decay horizon"
    return ""


def _at(step: int | None) -> str:
    return "after the last planned step" if step is None else f"at step {step}"
