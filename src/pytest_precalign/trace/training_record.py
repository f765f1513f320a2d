"""The one typed record of a training run, as a trace manifest carries it: the only writer and
reader of the manifest's ``"training"`` block (the run's settings and plan), ``"scalars"``
(what each step did, ``StepScalars``) and ``"initial_params"`` (each parameter before any
update). Every writer -- the tool's loop, the Trainer and megatron-core case trainers,
launched ranks, the ``Recorder``, ``PrecalignCallback`` -- builds these types and writes them
with ``run_record_keys``; the loaders read them with ``read_run_record`` (the only parse: every
other builder of a trace gives it the typed record, ``Trace.run``), and the verdict, the curves, the step replay and the contract
read ``Trace.run``.

A plan (``TrainingPlan``) is what a side WILL do at every optimizer step, made by running its
own framework's scheduler: each group's LR at each planned step, each group's weight decay and
parameter names, the optimizer's settings, clipping, accumulation, the loss normalisation over
micro-batches and the precision of the forward. Every field is written; ``None`` only where the
side's framework has no such setting (SGD has no betas, Adam no momentum) or the writer cannot
know it (a hand-written loop's loss normalisation). The rule for comparing two plans
(``verdict.training_contract``): a field both sides say is compared; a field neither says is
equal; a field one side does not say is not compared and the contract lists it
(``unsaid_settings``), so a report says what one side lacks. Except ``clip_grad``, whose None
says "not clipped" (``NONE_IS_A_VALUE``): it is always compared.

The JSON layout (``"training"``)::

    {"trainer": "hf_trainer", "framework": {"name": "transformers", "version": "4.57.1"},
     "arguments": {...the framework's own arguments, as given...},
     "plan": {"optimizer": "adamw", "lr": [[...per group], ...per step], "weight_decay": [...],
              "groups": [[names], ...], "betas": [0.9, 0.999], "eps": 1e-8, "momentum": null,
              "clip_grad": 1.0, "micro_batches": 2, "loss_normalisation": "per_token_over_step",
              "precision": "float32", "autocast": false,
              "gradient_checkpointing": false},
     "adapters": [{"name": "default", "r": 8, "alpha": 16, "dropout": 0.0,
                   "target_modules": ["q_proj", "v_proj"]}],
     "frozen": ["model.embed_tokens.weight", ...]}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import TraceError
from .json_fields import field_dict
from .step_scalars import SCALARS_KEY, StepScalars, scalars_manifest, scalars_of

TRAINING_KEY = "training"
INITIAL_PARAMS_KEY = "initial_params"
PLAN_KEY = "plan"
RUN_RECORD_KEYS = (TRAINING_KEY, SCALARS_KEY, INITIAL_PARAMS_KEY)  # a manifest's keys of its run record

# How the loss of a step split into micro-batches is normalised.
LOSS_NORMALISATIONS = (
    "per_token_over_step",  # summed over the step's tokens, divided by their count (HF num_items_in_batch)
    "mean_of_micro_batch_means",  # each micro-batch's mean, averaged (Lightning, a plain loss / k)
    "sum_of_micro_batch_means",  # each micro-batch's mean, summed (no division by the count)
)
# The dtype the forward computes in (by the parameters' dtype or by autocast).
PRECISIONS = ("float32", "bfloat16", "float16", "float64")
# The keys of a parameter's summary in ``initial_params``.
SUMMARY_KEYS = ("max", "min", "mean", "norm")
# Bounds of what a plan from a file may hold (a crafted manifest cannot make the reader allocate
# more than its own bytes allow; these only keep messages and loops sane).
MAX_PLAN_STEPS = 10_000_000


@dataclass(frozen=True)
class TrainingPlan:
    """What a side will do at every optimizer step (see the module doc for ``None``)."""

    optimizer: str  # "sgd", "adam", "adamw", or another optimizer's class name in lower case
    lr: tuple[tuple[float, ...], ...]  # [planned step][group]
    weight_decay: tuple[float, ...]  # [group]
    groups: tuple[tuple[str, ...], ...]  # [group] -> its parameters' names
    betas: tuple[float, float] | None = None  # None: the optimizer has none (SGD)
    eps: float | None = None  # None: the optimizer has none (SGD)
    momentum: float | None = None  # None: the optimizer has no such setting (Adam, AdamW)
    clip_grad: float | None = None  # max global grad norm; None: not clipped
    micro_batches: int | None = None  # micro-batches accumulated per optimizer step
    loss_normalisation: str | None = None  # one of LOSS_NORMALISATIONS
    precision: str | None = None  # one of PRECISIONS: what the forward computes in
    autocast: bool | None = None  # whether ``precision`` comes from autocast (not compared: a bf16
    # autocast side and a bf16-parameter side with fp32 main params both compute in bf16)
    gradient_checkpointing: bool | None = None

    @property
    def steps(self) -> int:
        return len(self.lr)

    def as_dict(self) -> dict[str, Any]:
        return field_dict(self)


# The plan's settings other than the schedule (lr, weight_decay, groups), in the order the
# contract compares them.
PLAN_SETTINGS = (
    "optimizer",
    "betas",
    "eps",
    "momentum",
    "clip_grad",
    "micro_batches",
    "loss_normalisation",
    "precision",
)
# Recorded, not compared: how the forward got its precision (``autocast``) and whether
# activations are recomputed (``gradient_checkpointing``) do not change what a step computes.
RECORDED_ONLY = ("autocast", "gradient_checkpointing")
# The settings whose None is itself a value, compared like any other: ``clip_grad`` None says
# "not clipped" (a side that clips and one that does not differ in their contract).
NONE_IS_A_VALUE = ("clip_grad",)


@dataclass(frozen=True)
class Adapter:
    """A PEFT adapter of the trained model (``model.peft_config[name]``)."""

    name: str
    kind: str  # PEFT's peft_type, e.g. "LORA"
    r: int | None = None
    alpha: float | None = None
    dropout: float | None = None
    target_modules: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return field_dict(self)


@dataclass(frozen=True)
class TrainingSettings:
    """The manifest's ``"training"`` block: who trained the side, with what, and its plan."""

    trainer: str  # "loop", "hf_trainer", "megatron", "callback", "recorder", ...
    framework: str  # the framework's distribution name ("transformers", "megatron-core", "torch")
    framework_version: str
    arguments: Mapping[str, Any] = field(default_factory=dict)  # the framework's own, as given (JSON)
    plan: TrainingPlan | None = None  # None: the writer was given no optimizer / scheduler
    adapters: tuple[Adapter, ...] = ()
    frozen: tuple[str, ...] | None = None  # parameters that do not train; None: not known
    # Why the writer could not write its plan ("" when it did, or was told not to): every
    # compare of this recording says so.
    plan_missing: str = ""

    def as_dict(self) -> dict[str, Any]:
        missing = {"plan_missing": self.plan_missing} if self.plan_missing else {}
        return {
            "trainer": self.trainer,
            "framework": {"name": self.framework, "version": self.framework_version},
            "arguments": dict(self.arguments),
            PLAN_KEY: None if self.plan is None else self.plan.as_dict(),
            "adapters": [a.as_dict() for a in self.adapters],
            "frozen": None if self.frozen is None else list(self.frozen),
            **missing,
        }


ParamSummary = Mapping[str, float]


@dataclass(frozen=True)
class RunRecord:
    """What a trace holds of a training run (each part empty / None when not recorded)."""

    settings: TrainingSettings | None = None
    scalars: Mapping[int, StepScalars] = field(default_factory=dict)
    initial_params: Mapping[str, ParamSummary] | None = None

    @property
    def plan(self) -> TrainingPlan | None:
        return None if self.settings is None else self.settings.plan

    @property
    def is_empty(self) -> bool:
        """Nothing recorded: no settings, no scalars, no initial parameters."""
        return self.settings is None and not self.scalars and self.initial_params is None

    @property
    def is_training(self) -> bool:
        return self.settings is not None or bool(self.scalars)

    def manifest_keys(self) -> dict[str, Any]:
        """Its manifest keys (``run_record_keys`` of the parts it holds)."""
        return run_record_keys(self.settings, self.scalars or None, self.initial_params)


NO_RUN = RunRecord()  # the record of a trace that is not of a training run


def run_record_keys(
    settings: TrainingSettings | None = None,
    scalars: Mapping[int, StepScalars] | None = None,
    initial_params: Mapping[str, ParamSummary] | None = None,
) -> dict[str, Any]:
    """The manifest keys of a run record (only the parts given): merge them into a manifest."""
    out: dict[str, Any] = {}
    if settings is not None:
        out[TRAINING_KEY] = settings.as_dict()
    if scalars is not None:
        out[SCALARS_KEY] = scalars_manifest(scalars)
    if initial_params is not None:
        out[INITIAL_PARAMS_KEY] = {name: dict(summary) for name, summary in initial_params.items()}
    return out


# -- reading ------------------------------------------------------------------------------------


def read_run_record(manifest: Mapping[str, Any], where: str = "manifest") -> RunRecord:
    """The run record a trace's manifest carries (the loaders' read); a ``TraceError`` naming
    ``where`` and the key for a value of the wrong type or range (never a traceback)."""
    return _record_of(manifest, where)


def read_evidence_file(data: Any, where: str) -> RunRecord:
    """The run record of a training evidence file: ``run_record_keys`` written alone as JSON
    (a launched rank's, ``run.trainers.megatron``), not a trace manifest, so it holds those keys
    and nothing else; each is read as in a manifest. A ``TraceError`` naming ``where``."""
    found = _mapping(data, where)
    unknown = sorted(set(found) - set(RUN_RECORD_KEYS))
    if unknown:
        raise TraceError(
            f"{where}: unknown key(s) {unknown[:5]} (a training evidence file holds only "
            f"{', '.join(RUN_RECORD_KEYS)})"
        )
    return _record_of(found, where)


def _record_of(manifest: Mapping[str, Any], where: str) -> RunRecord:
    raw = manifest.get(TRAINING_KEY)
    settings = None if raw is None else _settings_once(raw, f"{where}: {TRAINING_KEY}")
    initial = manifest.get(INITIAL_PARAMS_KEY)
    return RunRecord(
        settings,
        scalars_of(manifest, where),
        None if initial is None else _initial_params(initial, f"{where}: {INITIAL_PARAMS_KEY}"),
    )


_READ: list[tuple[Any, TrainingSettings]] = []  # the last settings read: (their JSON object, typed)
_READ_KEPT = 4


def _settings_once(raw: Any, where: str) -> TrainingSettings:
    """``settings_from_dict``, once per JSON object: a compare reads one step's manifest
    through several paths (the trace, the run record, the case facts), and a 300,000-step plan
    took seconds each time. The object is held with its result, so its identity is not reused."""
    for seen, settings in _READ:
        if seen is raw:
            return settings
    settings = settings_from_dict(raw, where)
    _READ.insert(0, (raw, settings))
    del _READ[_READ_KEPT:]
    return settings


def settings_from_dict(raw: Any, where: str) -> TrainingSettings:
    data = _mapping(raw, where)
    framework = _mapping(data.get("framework", {}), f"{where}.framework")
    plan = data.get(PLAN_KEY)
    frozen = data.get("frozen")
    return TrainingSettings(
        trainer=_text(data.get("trainer"), f"{where}.trainer"),
        framework=_text(framework.get("name", ""), f"{where}.framework.name", empty=True),
        framework_version=_text(framework.get("version", ""), f"{where}.framework.version", empty=True),
        arguments=_mapping(data.get("arguments", {}), f"{where}.arguments"),
        plan=None if plan is None else plan_from_dict(plan, f"{where}.{PLAN_KEY}"),
        plan_missing=_text(data.get("plan_missing", ""), f"{where}.plan_missing", empty=True),
        adapters=tuple(
            _adapter(a, f"{where}.adapters[{i}]")
            for i, a in enumerate(_sequence(data.get("adapters", []), f"{where}.adapters"))
        ),
        frozen=None if frozen is None else _names(frozen, f"{where}.frozen"),
    )


def plan_from_dict(raw: Any, where: str) -> TrainingPlan:
    """A plan from its JSON (see the module doc); every key is read, unknown keys refused."""
    data = _mapping(raw, where)
    unknown = set(data) - {"lr", "weight_decay", "groups", *RECORDED_ONLY, *PLAN_SETTINGS}
    if unknown:
        raise TraceError(
            f"{where}: unknown key(s) {sorted(unknown)[:5]} (allowed: lr, weight_decay, "
            f"groups, {', '.join((*PLAN_SETTINGS, *RECORDED_ONLY))})"
        )
    steps = _sequence(data.get("lr", []), f"{where}.lr")
    if len(steps) > MAX_PLAN_STEPS:
        raise TraceError(f"{where}.lr: {len(steps)} planned steps (at most {MAX_PLAN_STEPS})")
    groups = tuple(
        _names(g, f"{where}.groups[{i}]")
        for i, g in enumerate(_sequence(data.get("groups", []), f"{where}.groups"))
    )
    lr = tuple(
        tuple(_number(v, f"{where}.lr[{s}][{g}]") for g, v in enumerate(_sequence(row, f"{where}.lr[{s}]")))
        for s, row in enumerate(steps)
    )
    decay = tuple(
        _number(v, f"{where}.weight_decay[{g}]")
        for g, v in enumerate(_sequence(data.get("weight_decay", []), f"{where}.weight_decay"))
    )
    for s, row in enumerate(lr):
        if groups and len(row) != len(groups):
            raise TraceError(f"{where}.lr[{s}]: {len(row)} groups, the plan has {len(groups)} (groups)")
    if groups and decay and len(decay) != len(groups):
        raise TraceError(f"{where}.weight_decay: {len(decay)} groups, the plan has {len(groups)} (groups)")
    betas = data.get("betas")
    if betas is not None:
        pair = _sequence(betas, f"{where}.betas")
        if len(pair) != 2:
            raise TraceError(f"{where}.betas: expected two numbers, got {len(pair)}")
        betas = (_number(pair[0], f"{where}.betas[0]"), _number(pair[1], f"{where}.betas[1]"))
    micro = data.get("micro_batches")
    if micro is not None and (not isinstance(micro, int) or isinstance(micro, bool) or micro < 1):
        raise TraceError(f"{where}.micro_batches: expected an integer >= 1 or null, got {_show(micro)}")
    return TrainingPlan(
        optimizer=_text(data.get("optimizer"), f"{where}.optimizer"),
        lr=lr,
        weight_decay=decay,
        groups=groups,
        betas=betas,
        eps=_optional_number(data.get("eps"), f"{where}.eps"),
        momentum=_optional_number(data.get("momentum"), f"{where}.momentum"),
        clip_grad=_optional_number(data.get("clip_grad"), f"{where}.clip_grad"),
        micro_batches=micro,
        loss_normalisation=_choice(
            data.get("loss_normalisation"), LOSS_NORMALISATIONS, f"{where}.loss_normalisation"
        ),
        precision=_choice(data.get("precision"), PRECISIONS, f"{where}.precision"),
        autocast=_optional_bool(data.get("autocast"), f"{where}.autocast"),
        gradient_checkpointing=_optional_bool(
            data.get("gradient_checkpointing"), f"{where}.gradient_checkpointing"
        ),
    )


def _adapter(raw: Any, where: str) -> Adapter:
    data = _mapping(raw, where)
    r = data.get("r")
    if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r < 0):
        raise TraceError(f"{where}.r: expected an integer >= 0 or null, got {_show(r)}")
    return Adapter(
        name=_text(data.get("name"), f"{where}.name"),
        kind=_text(data.get("kind", ""), f"{where}.kind", empty=True),
        r=r,
        alpha=_optional_number(data.get("alpha"), f"{where}.alpha"),
        dropout=_optional_number(data.get("dropout"), f"{where}.dropout"),
        target_modules=_names(data.get("target_modules", []), f"{where}.target_modules"),
    )


def _initial_params(raw: Any, where: str) -> dict[str, dict[str, float]]:
    data = _mapping(raw, where)
    out: dict[str, dict[str, float]] = {}
    for name, summary in data.items():
        values = _mapping(summary, f"{where}[{_show(name)}]")
        missing = [k for k in SUMMARY_KEYS if k not in values]
        if missing:
            raise TraceError(
                f"{where}[{_show(name)}]: missing {missing} (a summary has {list(SUMMARY_KEYS)})"
            )
        out[str(name)] = {
            k: _number(values[k], f"{where}[{_show(name)}].{k}", finite=False) for k in SUMMARY_KEYS
        }
    return out


# -- typed pieces -------------------------------------------------------------------------------


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TraceError(f"{where}: expected a mapping, got {type(value).__name__} {_show(value)}")
    return dict(value)


def _sequence(value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, (list, tuple)):
        raise TraceError(f"{where}: expected a list, got {type(value).__name__} {_show(value)}")
    return value


def _text(value: Any, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise TraceError(f"{where}: expected a non-empty string, got {_show(value)}")
    return value


def _names(value: Any, where: str) -> tuple[str, ...]:
    items = _sequence(value, where)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise TraceError(f"{where}[{i}]: expected a name (string), got {_show(item)}")
    return tuple(items)


def _number(value: Any, where: str, *, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"{where}: expected a number, got {type(value).__name__} {_show(value)}")
    out = float(value) if not isinstance(value, int) or abs(value) < 1 << 1023 else math.inf
    if finite and not math.isfinite(out):
        raise TraceError(f"{where}: expected a finite number, got {_show(value)}")
    return out


def _optional_number(value: Any, where: str) -> float | None:
    return None if value is None else _number(value, where)


def _optional_bool(value: Any, where: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TraceError(f"{where}: expected true, false or null, got {_show(value)}")
    return value


def _choice(value: Any, allowed: Sequence[str], where: str) -> str | None:
    if value is not None and value not in allowed:
        raise TraceError(f"{where}: {_show(value)} is not one of {', '.join(allowed)} (or null)")
    return value if value is None else str(value)


# -- two runs' records --------------------------------------------------------------------------


def split_free(baseline: TrainingPlan | None, candidate: TrainingPlan | None) -> bool:
    """Both sides normalise the loss per token over the whole step: the same rows split into
    other micro-batches give the same loss and grads, so the split is not a difference."""
    per_token = "per_token_over_step"
    return (
        baseline is not None
        and candidate is not None
        and baseline.loss_normalisation == candidate.loss_normalisation == per_token
    )
