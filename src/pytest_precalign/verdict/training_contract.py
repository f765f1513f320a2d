"""The contract check: what each side WILL do, compared before step 0 from the two sides'
typed plans (``trace.training_record.TrainingPlan``, the ``"plan"`` of each manifest's
``"training"``, made by running each framework's own scheduler; see TRAINING.md).

Per parameter (the candidate's names mapped to the baseline's by the case's mapping), the LR
and weight decay at every planned step; then the plan's settings in ``PLAN_SETTINGS`` order
(the optimizer, Adam's betas and eps, SGD's momentum, clipping, the micro-batches, the loss
normalisation over them, the forward's precision, gradient checkpointing). The first
difference is named with its step and parameter group, and what the LR sequences suggest (one
side lagging by a step, a shorter decay horizon).

The None rule (``training_record``): a setting both plans say is compared; a setting neither
says is equal; a setting one plan does not say (None: its framework has no such setting, or its
writer cannot know it) is not compared, and ``unsaid_settings`` lists it for the report. A
``clip_grad`` of None says "not clipped" (``NONE_IS_A_VALUE``): it is always compared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..trace.training_record import NONE_IS_A_VALUE, PLAN_SETTINGS, TrainingPlan, split_free
from ..untrusted import cut_text
from .contract_evidence import ContractEvidence, DecayDiffers, Groups, LrDiffers, SettingDiffers, StepsPlanned
from .run_patterns import (
    DecayHorizon,
    DecayOneSided,
    MicroBatchSplit,
    RunPattern,
    ScheduleScaled,
    ScheduleShifted,
)

Rename = Callable[[str], Sequence[str]]  # a candidate parameter name -> the baseline's names


def same_names(name: str) -> Sequence[str]:
    return (name,)


LR_RTOL = 1e-6  # two schedulers computing one formula in float64, stored as float32 at worst


@dataclass(frozen=True)
class ContractDiff:
    step: int  # the first planned step that differs (0 for settings of every step)
    origin: str  # "lr", "weight_decay", or the setting's name
    evidence: ContractEvidence  # told when rendered (``reports.contract_evidence_text``)
    pattern: RunPattern | None = None  # what the whole difference looks like ("one step behind")
    setting: bool = False  # a training setting other than the schedule (micro-batches, clipping)


def _groups_of(plan: TrainingPlan, rename: Rename) -> dict[str, int]:
    out: dict[str, int] = {}
    for index, names in enumerate(plan.groups):
        for name in names:
            for mapped in rename(str(name)):
                out.setdefault(mapped, index)
    return out


def _close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= LR_RTOL * max(abs(a), abs(b))


def check_contract(
    baseline: TrainingPlan, candidate: TrainingPlan, rename: Rename = same_names
) -> ContractDiff | None:
    """The first difference between two plans, or None when they agree (under the None rule:
    see the module doc and ``unsaid_settings``); ``rename`` gives the baseline's names of a
    candidate parameter (``mapping.spec.baseline_param_names``)."""
    base_groups = _groups_of(baseline, same_names)
    cand_groups = _groups_of(candidate, rename)
    pairs = sorted({(base_groups[n], cand_groups[n]) for n in base_groups if n in cand_groups})
    by_position = False
    if not pairs:
        count = min(len(baseline.groups), len(candidate.groups))
        pairs = [(g, g) for g in range(max(count, 1))]
        by_position = True
    example = {pair: n for n, g in base_groups.items() if (pair := (g, cand_groups.get(n, g))) in pairs}
    diff = _schedule_diff(baseline, candidate, pairs, example, by_position)
    return diff if diff is not None else _settings_diff(baseline, candidate)


def _schedule_diff(
    baseline: TrainingPlan,
    candidate: TrainingPlan,
    pairs: Sequence[tuple[int, int]],
    example: Mapping[tuple[int, int], str],
    by_position: bool,
) -> ContractDiff | None:
    lr_b, lr_c = baseline.lr, candidate.lr
    wd_b, wd_c = baseline.weight_decay, candidate.weight_decay
    for gb, gc in pairs:
        if gb < len(wd_b) and gc < len(wd_c) and not _close(float(wd_b[gb]), float(wd_c[gc])):
            groups = Groups(gb, gc, example.get((gb, gc)), by_position)
            told = DecayDiffers(wd_b[gb], wd_c[gc], groups)
            return ContractDiff(0, "weight_decay", told, _decay_pattern(wd_b[gb], wd_c[gc]))
    for step in range(max(len(lr_b), len(lr_c))):
        if step >= len(lr_b) or step >= len(lr_c):
            short = "baseline" if step >= len(lr_b) else "candidate"
            return ContractDiff(step, "lr", StepsPlanned(short, step, max(len(lr_b), len(lr_c))))
        for gb, gc in pairs:
            a, b = float(lr_b[step][gb]), float(lr_c[step][gc])
            if not _close(a, b):
                seq_b = [float(s[gb]) for s in lr_b]
                seq_c = [float(s[gc]) for s in lr_c]
                pattern = lr_pattern(seq_b, seq_c)
                groups = Groups(gb, gc, example.get((gb, gc)), by_position)
                return ContractDiff(step, "lr", LrDiffers(step, a, b, groups), pattern)
    return None


def _decay_pattern(base: float, cand: float) -> DecayOneSided | None:
    if float(base) == 0.0:
        return DecayOneSided(candidate=True)
    if float(cand) == 0.0:
        return DecayOneSided(candidate=False)
    return None


def lr_pattern(base: Sequence[float], cand: Sequence[float]) -> RunPattern | None:
    """What two LR sequences' difference looks like (None when nothing simple)."""
    n = min(len(base), len(cand))
    for lag in (1, 2, 3):
        if n > lag + 1 and all(_close(cand[s], base[s - lag]) for s in range(lag, n)):
            return ScheduleShifted(lag, behind=True)
        if n > lag + 1 and all(_close(base[s], cand[s - lag]) for s in range(lag, n)):
            return ScheduleShifted(lag, behind=False)
    if n and all(b != 0 for b in base[:n]):
        ratios = {round(c / b, 9) for b, c in zip(base[:n], cand[:n], strict=False)}
        if len(ratios) == 1:
            return ScheduleScaled(ratios.pop())
    peak_b, peak_c = max(base[:n], default=0.0), max(cand[:n], default=0.0)
    if _close(peak_b, peak_c):
        end_b, end_c = _reaches_floor(base), _reaches_floor(cand)
        if end_b != end_c:
            return DecayHorizon(end_b, end_c)
    return None


def _reaches_floor(seq: Sequence[float]) -> int | None:
    """The step from which the LR stays at its last value, when it stays there for at least
    two steps (None: still changing at the last planned step)."""
    last = seq[-1] if seq else 0.0
    step = len(seq)
    while step > 0 and _close(seq[step - 1], last):
        step -= 1
    return step if len(seq) - step >= 2 else None


def unsaid_settings(baseline: TrainingPlan, candidate: TrainingPlan) -> tuple[str, ...]:
    """The settings of ``PLAN_SETTINGS`` one plan says and the other does not (None): not
    compared, listed so a report says what one side lacks (``side: setting``)."""
    out = []
    for key in PLAN_SETTINGS:
        if key in NONE_IS_A_VALUE:
            continue
        a, b = getattr(baseline, key), getattr(candidate, key)
        if (a is None) != (b is None):
            side, value = ("baseline", a) if b is None else ("candidate", b)
            out.append(f"{key} (only the {side} says: {_show(value)})")
    return tuple(out)


def _settings_diff(baseline: TrainingPlan, candidate: TrainingPlan) -> ContractDiff | None:
    for key in PLAN_SETTINGS:
        a, b = getattr(baseline, key), getattr(candidate, key)
        if (a is None or b is None) and key not in NONE_IS_A_VALUE:
            continue  # neither says (equal), or one side does not say (unsaid_settings)
        if _same(a, b) or (key == "loss_normalisation" and _one_micro_batch(baseline, candidate)):
            continue
        if key == "micro_batches" and split_free(baseline, candidate):
            continue
        pattern = MicroBatchSplit(a, b, planned=True) if key == "micro_batches" else None
        return ContractDiff(0, key, SettingDiffers(key, a, b), pattern, setting=True)
    return None


def _one_micro_batch(baseline: TrainingPlan, candidate: TrainingPlan) -> bool:
    """Both sides step on one micro-batch: every loss normalisation over micro-batches is the
    same loss (per token over the step = the micro-batch's mean = their mean of means)."""
    return baseline.micro_batches == candidate.micro_batches == 1


def _show(value: Any) -> str:
    return cut_text(repr(list(value)) if isinstance(value, tuple) else repr(value))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return _close(float(a), float(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
