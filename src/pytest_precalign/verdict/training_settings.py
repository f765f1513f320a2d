"""The two sides' training settings (``TrainingSettings``, the manifest's ``"training"``) judged
before step 0, with the plans' contract (``training_contract``).

Two kinds of difference are contract findings of their own, since no plan field carries them:
the PEFT adapters (by adapter name: ``peft_type``, ``r``, ``lora_alpha``, ``lora_dropout``,
``target_modules``; an adapter one side lacks) and the precision the forward computes in
(``bf16 autocast off vs on``). A plan difference the contract found is then told in the
framework's own words when both sides ran the same framework: the arguments that set the
differing plan field and differ between the sides (``lr_scheduler_type cosine vs linear: LR
differs from step 3 (4.810e-03 vs 4.375e-03)``); run-local arguments (output and logging
folders, run name, seed) are never read. Same arguments and another LR plan: the scheduler
object itself differs (a custom or patched scheduler), and the finding says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..trace.training_record import Adapter, TrainingPlan, TrainingSettings
from .contract_evidence import (
    AdapterDiffers,
    AdapterOnlyOn,
    ArgumentDiffers,
    ContractEvidence,
    LrFrom,
    PrecisionDiffers,
    SchedulerItself,
    SetBy,
)
from .run_patterns import AdapterOneSided
from .training_contract import ContractDiff, Rename, check_contract, same_names

# An adapter's fields, in PEFT's words (``LoraConfig``).
ADAPTER_WORDS: tuple[tuple[str, str], ...] = (
    ("kind", "peft_type"),
    ("r", "r"),
    ("alpha", "lora_alpha"),
    ("dropout", "lora_dropout"),
    ("target_modules", "target_modules"),
)

# A plan field -> the transformers ``TrainingArguments`` that set it.
TRAINER_ARGUMENTS: Mapping[str, tuple[str, ...]] = {
    "lr": (
        "lr_scheduler_type",
        "learning_rate",
        "warmup_steps",
        "warmup_ratio",
        "lr_scheduler_kwargs",
        "max_steps",
        "num_train_epochs",
    ),
    "weight_decay": ("weight_decay",),
    "groups": ("weight_decay",),
    "clip_grad": ("max_grad_norm",),
    "micro_batches": ("gradient_accumulation_steps", "per_device_train_batch_size"),
    "betas": ("adam_beta1", "adam_beta2"),
    "eps": ("adam_epsilon",),
    "optimizer": ("optim", "optim_args"),
    "momentum": ("optim_args",),
    "loss_normalisation": ("average_tokens_across_devices",),
    "precision": ("bf16", "fp16"),
    "gradient_checkpointing": ("gradient_checkpointing",),
}
ARGUMENTS_KEY = "TrainingArguments"  # where a Trainer's settings keep its arguments' fields


def judge_plans(
    plans: tuple[TrainingPlan | None, TrainingPlan | None],
    settings: tuple[TrainingSettings | None, TrainingSettings | None],
    rename: Rename = same_names,
) -> ContractDiff | None:
    """The one predicate of "the sides' plans differ": the first difference before training of
    the baseline's and the candidate's ``plans`` (``check_contract``, when both have one) and
    ``settings`` (``settings_contract``: adapters, precision, the plans' difference in the
    framework's words), or None. Judged before training (``run.contract_check``: a difference
    stops the case there) and at step 0 of the run verdict (``training_run``): both say the same."""
    diff = None
    if plans[0] is not None and plans[1] is not None:
        diff = check_contract(plans[0], plans[1], rename)
    return settings_contract(settings[0], settings[1], diff)


def settings_contract(
    baseline: TrainingSettings | None,
    candidate: TrainingSettings | None,
    plan_diff: ContractDiff | None,
) -> ContractDiff | None:
    """The first settings difference before training: the adapters, the precision, then the
    plans' contract difference ``plan_diff`` told in the framework's words (None: none)."""
    if baseline is not None and candidate is not None:
        found = adapter_diff(baseline.adapters, candidate.adapters) or _precision_diff(baseline, candidate)
        if found is not None:
            return found
    if plan_diff is None or baseline is None or candidate is None:
        return plan_diff
    return explained(plan_diff, baseline, candidate)


def adapter_diff(baseline: Sequence[Adapter], candidate: Sequence[Adapter]) -> ContractDiff | None:
    """The first difference between the sides' PEFT adapters (by name), in PEFT's words."""
    base = {a.name: a for a in baseline}
    cand = {a.name: a for a in candidate}
    for name in sorted(set(base) | set(cand)):
        a, b = base.get(name), cand.get(name)
        if a is None or b is None:
            side, only = ("candidate", b) if a is None else ("baseline", a)
            assert only is not None
            evidence = AdapterOnlyOn(name, side, only)
            return ContractDiff(0, "adapters", evidence, AdapterOneSided(), True)
        for field, word in ADAPTER_WORDS:
            x, y = getattr(a, field), getattr(b, field)
            if x != y:
                return ContractDiff(0, word, AdapterDiffers(word, x, y, name), setting=True)
    return None


def _precision_diff(baseline: TrainingSettings, candidate: TrainingSettings) -> ContractDiff | None:
    a, b = baseline.plan, candidate.plan
    if a is None or b is None or a.precision is None or b.precision is None or a.precision == b.precision:
        return None
    words = _differing(baseline, candidate, TRAINER_ARGUMENTS["precision"])
    autocast = None
    if a.autocast is not None and b.autocast is not None and a.autocast != b.autocast:
        autocast = (a.autocast, b.autocast)
    return ContractDiff(
        0, "precision", PrecisionDiffers(a.precision, b.precision, words, autocast), setting=True
    )


def explained(diff: ContractDiff, baseline: TrainingSettings, candidate: TrainingSettings) -> ContractDiff:
    """``diff`` told by the framework arguments that set it and differ (same framework only);
    its origin stays the plan's field (``lr``, ``clip_grad``...), one name across frameworks."""
    keys = TRAINER_ARGUMENTS.get(diff.origin)
    if keys is None or baseline.framework != candidate.framework:
        return diff
    base_args, cand_args = _arguments(baseline), _arguments(candidate)
    if base_args is None or cand_args is None:
        return diff
    words = _differing(baseline, candidate, keys)
    if diff.origin == "lr":
        told = _lr_words(diff, baseline.plan, candidate.plan)
        if not words:
            agree = tuple(k for k in keys if k in base_args)
            return replace(diff, evidence=SchedulerItself(told, baseline.framework, agree))
        return replace(diff, evidence=SetBy(words, told))
    if not words:
        return diff
    return replace(diff, evidence=SetBy(words, diff.evidence))


def _lr_words(
    diff: ContractDiff, baseline: TrainingPlan | None, candidate: TrainingPlan | None
) -> ContractEvidence:
    """``LR differs from step s (a vs b)`` from the plans (the contract's evidence otherwise)."""
    if baseline is None or candidate is None:
        return diff.evidence
    s = diff.step
    if s >= baseline.steps or s >= candidate.steps:
        return diff.evidence
    for a, b in zip(baseline.lr[s], candidate.lr[s], strict=False):
        if a != b:
            return LrFrom(s, a, b)
    return diff.evidence


def _arguments(settings: TrainingSettings) -> Mapping[str, Any] | None:
    fields = settings.arguments.get(ARGUMENTS_KEY)
    return fields if isinstance(fields, Mapping) else None


def _differing(
    baseline: TrainingSettings, candidate: TrainingSettings, keys: Sequence[str]
) -> tuple[ArgumentDiffers, ...]:
    """Each of ``keys`` both sides' arguments have and differ in."""
    if baseline.framework != candidate.framework:
        return ()
    a, b = _arguments(baseline), _arguments(candidate)
    if a is None or b is None:
        return ()
    return tuple(
        ArgumentDiffers(key, a[key], b[key]) for key in keys if key in a and key in b and a[key] != b[key]
    )
