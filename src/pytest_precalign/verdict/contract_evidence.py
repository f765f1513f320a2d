"""Why the sides' plans differ before step 0 (``training_contract.ContractDiff.evidence``), as
facts: the setting, the values, the groups and the framework arguments each sentence states;
the words are made when the verdict is rendered (``reports.contract_evidence_text``). No torch
import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from ..trace.training_record import Adapter
from .side_values import NamedValues, StepValues, Values

# A value of a side's plan (a ``TrainingPlan`` setting: ``betas`` a pair) or of its PEFT adapter.
PlanValue: TypeAlias = "str | int | float | bool | tuple[float, ...] | tuple[str, ...] | None"
# A framework argument as the side recorded it (``TrainingSettings.arguments``: JSON).
JsonValue: TypeAlias = "str | int | float | bool | None | list[JsonValue] | dict[str, JsonValue]"


@dataclass(frozen=True)
class Groups:
    """The parameter groups compared: ``param`` an example parameter of both (None: none paired,
    the groups named by index), ``by_position`` when no name paired through the mapping."""

    base: int
    cand: int
    param: str | None
    by_position: bool = False


@dataclass(frozen=True)
class DecayDiffers(Values[float]):
    groups: Groups


@dataclass(frozen=True)
class LrDiffers(StepValues[float]):
    groups: Groups


@dataclass(frozen=True)
class StepsPlanned:
    short: str  # the side that plans fewer steps
    steps: int  # how many it plans
    other: int  # how many the other plans


@dataclass(frozen=True)
class SettingDiffers(NamedValues[PlanValue]):
    """The plan setting ``name`` (a ``PLAN_SETTINGS`` field), each side's value (shown cut:
    ``untrusted.cut_text``)."""


@dataclass(frozen=True)
class AdapterOnlyOn:
    name: str
    side: str
    adapter: Adapter


@dataclass(frozen=True)
class AdapterDiffers:
    word: str  # the field in PEFT's words
    a: PlanValue
    b: PlanValue
    name: str  # the adapter


@dataclass(frozen=True)
class ArgumentDiffers(NamedValues[JsonValue]):
    """A framework argument (``name``) both sides' ``TrainingArguments`` hold and differ in."""


@dataclass(frozen=True)
class PrecisionDiffers(Values[str]):
    """The precision the forward computes in, each side."""

    arguments: tuple[ArgumentDiffers, ...] = ()  # the arguments that set it
    autocast: tuple[bool, bool] | None = None  # each side's autocast, when they differ


@dataclass(frozen=True)
class LrFrom(StepValues[float]):
    """The plans' LR differs from ``step`` (the first group's values)."""


@dataclass(frozen=True)
class SchedulerItself:
    """Same framework arguments for the LR, another LR plan: the scheduler object differs."""

    told: ContractEvidence  # the LR difference
    framework: str
    keys: tuple[str, ...]  # the arguments that set the LR, on both sides and equal


@dataclass(frozen=True)
class SetBy:
    """``told``, set by these framework ``arguments`` that differ between the sides."""

    arguments: tuple[ArgumentDiffers, ...]
    told: ContractEvidence


ContractEvidence = (
    DecayDiffers
    | LrDiffers
    | StepsPlanned
    | SettingDiffers
    | AdapterOnlyOn
    | AdapterDiffers
    | PrecisionDiffers
    | LrFrom
    | SchedulerItself
    | SetBy
)
