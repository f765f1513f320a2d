"""One story per case: the case's origin is the first divergence across its phases in
execution order (step k's forward, backward and optimizer step before step k+1's); every
later failing phase is downstream of it, keeps its own table and gets no origin of its own.
A phase that fails while every earlier one is aligned (a backward-only fault) has its own
origin, which is then the case's.

A training run whose data differs (the run verdict's ``data``: the batch of step ``d`` hashes
differently) has no module origin from step ``d`` on: a module fed those ids did not have
matching inputs, so no divergence at or after ``d`` is told as "its inputs matched"; it is the
first divergent paired record, unproven, and the story names the data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from ..vocabulary import Phase
from .evidence import CaseOrigin, aside_note
from .phase import Divergence, PhaseVerdict

P = TypeVar("P", bound=str)


def origin_of(first: Divergence, matched_children: Sequence[str] = ()) -> CaseOrigin:
    """The case origin a phase's first divergence names, with its evidence in words. Without
    a paired module to name (no enclosing module whose inputs matched), the origin is the first
    divergent paired record's module, unproven."""
    if first.origin:
        module = first.origin_module or first.name
        evidence = first.proof or "its inputs matched, its output did not"
        if first.kind == "param" and not first.proof:
            evidence = "its grad matched, the optimizer step made it differ"
        proven = first.proven
    else:
        module = first.origin_module
        evidence = first.proof or _between_children(first, matched_children)
        proven = first.proven and bool(module)
    role = "innermost module whose inputs all matched"
    if first.inputs_aside:
        evidence = f"{evidence}; {aside_note(first.inputs_aside)}"
    if not module:
        module, role, proven = first.name, "first divergent paired module", False
    return CaseOrigin(module, first.phase, first.kind, first.step, first.name, evidence, proven, role)


def _between_children(first: Divergence, matched: Sequence[str]) -> str:
    """``its inputs and children q_proj, k_proj matched, o_proj's input did not``."""
    module = first.origin_module
    if not module:
        return "no enclosing module with matching inputs was recorded"
    child = first.name[len(module) + 1 :] if first.name.startswith(module + ".") else first.name
    what = "input" if first.phase == "forward" else "grad w.r.t. its output"
    shown = ", ".join(matched[:6]) + (", ..." if len(matched) > 6 else "")
    children = f" and children {shown}" if shown else ""
    return f"its inputs{children} matched, {child}'s {what} did not: the divergence enters in its own code"


def _position(verdict: PhaseVerdict, phases: Sequence[str]) -> tuple[int, int]:
    first = verdict.first
    assert first is not None
    return first.step, phases.index(verdict.phase)


def other_data(first: Divergence, step: int, evidence: str) -> Divergence:
    """``first`` when the batch of ``step`` differs (``evidence``, the run verdict's): not an
    origin at or after that step, its inputs not said to match (no enclosing module named)."""
    if first.step < step:
        return first
    where = "" if first.step == step else f"downstream of step {step}'s data: "
    proof = (
        f"origin unproven: {where}{evidence}; the step's inputs were other data (the run verdict says data)"
    )
    return replace(first, origin=False, origin_module="", proof=proof, proven=False)


def tell_case(
    verdicts: Mapping[P, PhaseVerdict], phases: Sequence[Phase], data: tuple[int, str] | None = None
) -> dict[P, PhaseVerdict]:
    """Each phase's verdict with the case's origin; the phases after it are downstream.
    ``data``: the step whose batch differs and the evidence (``other_data``)."""
    if data is not None:
        verdicts = {
            phase: v if v.first is None else replace(v, first=other_data(v.first, *data), matched_children=())
            for phase, v in verdicts.items()
        }
    failing = [v for v in verdicts.values() if v.first is not None]
    if not failing:
        return dict(verdicts)
    head = min(failing, key=lambda v: _position(v, phases))
    assert head.first is not None
    origin = origin_of(head.first, head.matched_children)
    out: dict[P, PhaseVerdict] = {}
    for phase, verdict in verdicts.items():
        if verdict is head:
            out[phase] = replace(verdict, case_origin=origin)
        elif verdict.first is not None:
            entry = origin.module or origin.record
            first = replace(verdict.first, origin=False, origin_module=entry, proof="", proven=True)
            out[phase] = replace(verdict, first=first, case_origin=origin, downstream=True)
        else:
            out[phase] = replace(verdict, case_origin=origin)
    return out
