"""A finished case: two traces, mapped, compared and judged (no models, no torch import).

``finish`` is shared by live cases (``runner``) and offline compares (``offline``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..compare.op_pairing import settle_op_pairs
from ..compare.pairs import Comparison, compare_traces
from ..compare.tolerances import ToleranceTable
from ..config.specs import CaseSpec
from ..mapping.apply import map_trace
from ..mapping.spec import MappingSpec
from ..trace.records import Trace
from ..verdict.phase import PhaseVerdict, phase_verdict
from ..vocabulary import Phase

if TYPE_CHECKING:
    from ..mapping.weights import SyncReport


@dataclass(frozen=True)
class CaseRun:
    name: str
    phases: tuple[Phase, ...]
    comparison: Comparison
    verdicts: Mapping[Phase, PhaseVerdict]
    baseline: Trace
    candidate: Trace  # already in the baseline's names
    sync: SyncReport | None
    seconds: float
    table: str
    environment: Mapping[str, Any] = field(default_factory=dict)
    custom_metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # record id -> values


def finish(
    name: str,
    phases: tuple[Phase, ...],
    base_trace: Trace,
    cand_trace: Trace,
    mapping: MappingSpec | None,
    table: ToleranceTable,
    case: CaseSpec | None,
    sync: SyncReport | None,
    started: float,
    env: Mapping[str, Any],
    isolated: Comparison | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CaseRun:
    mapped = map_trace(cand_trace, base_trace, mapping)
    comparison = compare_traces(base_trace, mapped.trace, table, mapped.reasons, progress)
    comparison = settle_op_pairs(comparison, base_trace, mapped.trace)
    expect = case.expect if case is not None else None
    verdicts = {}
    for phase in phases:
        earlier = expect is not None and phases.index(expect.phase) < phases.index(phase)
        parents = base_trace.manifest.get("parents") or {}
        verdicts[phase] = phase_verdict(comparison, phase, expect, earlier, isolated, parents)
    return CaseRun(
        name=name,
        phases=phases,
        comparison=comparison,
        verdicts=verdicts,
        baseline=base_trace,
        candidate=mapped.trace,
        sync=sync,
        seconds=time.perf_counter() - started,
        table=table.name,
        environment=env,
    )
