"""A PEFT (LoRA) run against a plain or merged one: PEFT's names brought to the base model's.

PEFT wraps each target module ``X`` in its own layer: the base module moves to
``X.base_layer`` (its parameters to ``X.base_layer.weight`` ...), the adapter adds
``X.lora_A.<adapter>``, ``X.lora_B.<adapter>``, ``X.lora_dropout.<adapter>`` (and DoRA's
``lora_magnitude_vector``), and ``X`` itself is the wrapper whose output -- base plus the
adapter's delta -- is what the rest of the model sees, as a plain or merged model's ``X``.

When exactly one side has ``base_layer`` names (``peft_aligned``): the parameter records
``X.base_layer.P`` and ``X.P`` are paired (the candidate's renamed to the baseline's name; its
``initial_params`` and ``training.frozen`` too), ``X`` pairs with ``X`` as it is, and the
records only the PEFT side can have -- the ``X.base_layer`` module (its output is the other
side's ``X`` without the adapter) and the adapter's modules and parameters -- are unmatched
with that reason, not unexplained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..trace.records import Record, Trace

BASE_LAYER = ".base_layer"
ADAPTER_PARTS = (
    "lora_A",
    "lora_B",
    "lora_dropout",
    "lora_embedding_A",
    "lora_embedding_B",
    "lora_magnitude_vector",
)
PARAM_KINDS = ("param", "param_grad")


def base_name(name: str) -> str:
    """``X.base_layer.P`` -> ``X.P`` (other names unchanged)."""
    return name.replace(BASE_LAYER + ".", ".") if (BASE_LAYER + ".") in name else name


def _has_peft(names: Iterable[str]) -> bool:
    return any(BASE_LAYER + "." in n + "." for n in names)


def peft_aligned(baseline: Trace, candidate: Trace) -> tuple[Trace, dict[str, str]]:
    """``candidate`` with PEFT's parameter names paired to the other side's, and why each
    PEFT-only record has no counterpart (record id -> reason); unchanged when both sides or
    neither side have ``base_layer`` names."""
    base_names = {r.name for r in baseline.records} | set(_initial(baseline))
    cand_names = {r.name for r in candidate.records} | set(_initial(candidate))
    base_peft, cand_peft = _has_peft(base_names), _has_peft(cand_names)
    if base_peft == cand_peft:
        return candidate, {}
    if cand_peft:  # the candidate's X.base_layer.P -> the baseline's X.P
        rename = {n: base_name(n) for n in cand_names if base_name(n) != n and base_name(n) in base_names}
        peft_side, other = candidate, "baseline"
    else:  # the candidate's X.P -> the baseline's X.base_layer.P
        rename = {base_name(n): n for n in base_names if base_name(n) != n and base_name(n) in cand_names}
        peft_side, other = baseline, "candidate"
    renamed = _renamed(candidate, rename)
    reasons = {}
    for rec in peft_side.records:
        if rec.kind in PARAM_KINDS and rec.name in (rename if cand_peft else set(rename.values())):
            continue
        why = _why(rec.name, other)
        if why:
            reasons[rec.id] = why
    return renamed, reasons


def _why(name: str, other: str) -> str:
    parts = name.split(".")
    if any(p in ADAPTER_PARTS for p in parts):
        return f"a PEFT adapter's ({name}): the {other} has no adapter"
    if "base_layer" in parts:
        module = name.split(BASE_LAYER)[0]
        return (
            f"PEFT's base layer of {module}: the {other}'s {module} has no adapter around it "
            f"({module} is paired with {module})"
        )
    return ""


def _initial(trace: Trace) -> Mapping[str, Any]:
    return trace.run.initial_params or {}


def _renamed(trace: Trace, rename: Mapping[str, str]) -> Trace:
    """The trace with its parameter records, initial params and frozen names renamed."""
    if not rename:
        return trace
    ids: dict[str, str] = {}
    records: list[Record] = []
    for rec in trace.records:
        new = rename.get(rec.name) if rec.kind in PARAM_KINDS else None
        if new is not None:
            moved = replace(rec, name=new)
            ids[rec.id] = moved.id
            records.append(moved)
        else:
            records.append(rec)
    records = [
        r if not any(d in ids for d in r.deps) else replace(r, deps=tuple(ids.get(d, d) for d in r.deps))
        for r in records
    ]
    run = trace.run
    settings = run.settings
    if settings is not None and settings.frozen is not None:
        settings = replace(settings, frozen=tuple(rename.get(n, n) for n in settings.frozen))
    initial = run.initial_params
    if initial is not None:
        initial = {rename.get(n, n): v for n, v in initial.items()}
    return trace.with_records(tuple(records)).with_run(
        replace(run, settings=settings, initial_params=initial)
    )
