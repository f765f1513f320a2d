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
from .origin_facts import (
    BetweenChildren,
    CaseOrigin,
    Matched,
    NoMatchedModule,
    OriginProof,
    OriginRole,
    OtherData,
)
from .phase import Divergence, PhaseVerdict
from .run_evidence import RunEvidence

P = TypeVar("P", bound=str)


def origin_of(first: Divergence, matched_children: Sequence[str] = ()) -> CaseOrigin:
    """The case origin a phase's first divergence names, with its evidence as a fact. Without
    a paired module to name (no enclosing module whose inputs matched), the origin is the first
    divergent paired record's module, unproven."""
    evidence: OriginProof
    if first.origin:
        module = first.origin_module or first.name
        evidence = first.proof or Matched("grad" if first.kind == "param" else "inputs")
        proven = first.proven
    else:
        module = first.origin_module
        evidence = first.proof or _between_children(first, matched_children)
        proven = first.proven and bool(module)
    role: OriginRole = "matched_inputs"
    if not module:
        module, role, proven = first.name, "first_paired", False
    return CaseOrigin(
        module, first.phase, first.kind, first.step, first.name, evidence, proven, role, first.inputs_aside
    )


def _between_children(first: Divergence, matched: Sequence[str]) -> BetweenChildren | NoMatchedModule:
    """``module``'s inputs and children ``matched`` matched, what the failing child received did not."""
    module = first.origin_module
    if not module:
        return NoMatchedModule(walked=False)
    child = first.name[len(module) + 1 :] if first.name.startswith(module + ".") else first.name
    return BetweenChildren(
        module, child, "input" if first.phase == "forward" else "output_grad", tuple(matched)
    )


def _position(verdict: PhaseVerdict, phases: Sequence[str]) -> tuple[int, int]:
    first = verdict.first
    assert first is not None
    return first.step, phases.index(verdict.phase)


def other_data(first: Divergence, step: int, evidence: RunEvidence) -> Divergence:
    """``first`` when the batch of ``step`` differs (``evidence``, the run verdict's): not an
    origin at or after that step, its inputs not said to match (no enclosing module named)."""
    if first.step < step:
        return first
    proof = OtherData(step, first.step != step, evidence)
    return replace(first, origin=False, origin_module="", proof=proof, proven=False)


def tell_case(
    verdicts: Mapping[P, PhaseVerdict], phases: Sequence[Phase], data: tuple[int, RunEvidence] | None = None
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
            first = replace(verdict.first, origin=False, origin_module=entry, proof=None, proven=True)
            out[phase] = replace(verdict, first=first, case_origin=origin, downstream=True)
        else:
            out[phase] = replace(verdict, case_origin=origin)
    return out
