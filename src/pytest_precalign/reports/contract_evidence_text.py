"""Why the sides' plans differ before step 0, in words, made when the verdict is rendered (the
verdict holds the facts: ``verdict.contract_evidence``); adapters in PEFT's words, arguments in
the framework's own."""

from __future__ import annotations

import math

from ..untrusted import cut_text
from ..verdict.contract_evidence import (
    AdapterDiffers,
    AdapterOnlyOn,
    ArgumentDiffers,
    ContractEvidence,
    DecayDiffers,
    Groups,
    JsonValue,
    LrDiffers,
    LrFrom,
    PlanValue,
    PrecisionDiffers,
    SchedulerItself,
    SetBy,
    SettingDiffers,
    StepsPlanned,
)
from ..verdict.training_settings import ADAPTER_WORDS

BY_POSITION = " (parameter names did not pair through the mapping: groups compared by position)"


def contract_evidence_text(fact: ContractEvidence) -> str:
    """The plans' first difference, in words."""
    match fact:
        case DecayDiffers(a, b, g):
            return f"weight_decay of {_who(g)}: {a:.4g} vs {b:.4g} (baseline group {g.base}, candidate group {g.cand}){_note(g)}"
        case LrDiffers(step, a, b, g):
            return (
                f"lr at step {step}: {a:.3e} vs {b:.3e} ({_who(g)}: baseline group {g.base}, "
                f"candidate group {g.cand}){_note(g)}"
            )
        case StepsPlanned(short, steps, other):
            return f"the {short} plans {steps} steps, the other {other}"
        case SettingDiffers(name, a, b):
            return f"{name}: {_show(a)} vs {_show(b)}"
        case AdapterOnlyOn(name, side, adapter):
            held = ", ".join(
                f"{word} {_word(getattr(adapter, field))}"
                for field, word in ADAPTER_WORDS
                if getattr(adapter, field) not in (None, ())
            )
            return f"PEFT adapter {name!r} ({held}) only on the {side}"
        case AdapterDiffers(word, a, b, name):
            return f"{word} {_word(a)} vs {_word(b)} (PEFT adapter {name!r})"
        case PrecisionDiffers(a, b, arguments, autocast):
            if arguments:
                return f"{_arguments(arguments)}: the forward computes in {a} vs {b}"
            told = f" (autocast {_on(autocast[0])} vs {_on(autocast[1])})" if autocast is not None else ""
            return f"precision {a} vs {b}{told}"
        case LrFrom(step, a, b):
            return f"LR differs from step {step} ({a:.3e} vs {b:.3e})"
        case SchedulerItself(told, framework, keys):
            return (
                f"{contract_evidence_text(told)}; the {framework} arguments that set the LR agree "
                f"({', '.join(keys)}): the scheduler object itself differs"
            )
    assert isinstance(fact, SetBy)
    return f"{_arguments(fact.arguments)}: {contract_evidence_text(fact.told)}"


def _who(g: Groups) -> str:
    return g.param if g.param is not None else f"group {g.base}"


def _note(g: Groups) -> str:
    return BY_POSITION if g.by_position else ""


def _arguments(arguments: tuple[ArgumentDiffers, ...]) -> str:
    """``key a vs b`` for each framework argument that differs."""
    out = []
    for arg in arguments:
        x, y = arg.a, arg.b
        if arg.name in ("bf16", "fp16") and isinstance(x, bool) and isinstance(y, bool):
            out.append(f"{arg.name} autocast {_on(x)} vs {_on(y)}")
        else:
            out.append(f"{arg.name} {_word(x)} vs {_word(y)}")
    return ", ".join(out)


def _show(value: PlanValue | JsonValue) -> str:
    return cut_text(repr(list(value)) if isinstance(value, tuple) else repr(value))


def _on(value: bool) -> str:
    return "on" if value else "off"


def _word(value: PlanValue | JsonValue) -> str:
    if isinstance(value, float):
        return f"{int(value)}" if value.is_integer() and math.isfinite(value) else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return cut_text("[" + ", ".join(_word(v) for v in value) + "]")
    return cut_text(str(value))
