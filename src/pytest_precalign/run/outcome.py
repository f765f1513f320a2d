"""A finished case as data (``CaseRun``). No models, no torch import, no pytest (what a
test item came to is ``reports.outcome``'s ``ItemOutcome``).

``finish`` (map, compare, then one call of ``verdict.case_verdict.judge_case``) is shared by
live cases, stored baselines, dump cases, the search and offline compares; ``judged_again``
judges a finished case again with what the replay of its first divergent step found. ``run``
never finishes a verdict itself. ``PerCase`` is the "run a case once for all its phase items,
free it after the last" bookkeeping.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..compare.moe_tokens import by_token
from ..compare.op_pairing import settle_op_pairs
from ..compare.pairs import Comparison, compare_traces
from ..compare.tolerances import ToleranceTable
from ..compare.workers import compare_workers
from ..config.specs import CaseSpec
from ..errors import PrecalignError
from ..mapping.apply import map_trace
from ..mapping.peft_names import peft_aligned
from ..mapping.spec import MappingSpec, baseline_param_names
from ..mapping.usage import MappingUse, check_applied
from ..parallel.dp_join import without_lone_replica_grads
from ..specs.coverage import DEFAULT_MIN_COVERAGE
from ..trace.merged_stats import with_merged
from ..trace.records import Trace
from ..verdict.case_facts import CaseFacts, case_facts
from ..verdict.case_verdict import CaseJudging, judge_case
from ..verdict.phase import PhaseVerdict
from ..verdict.replay_finding import Replay
from ..verdict.training_envelope import CleanReruns
from ..verdict.training_run import TrainingVerdict
from ..vocabulary import Phase
from .both_recorded import OnBoth, on_both

if TYPE_CHECKING:
    from ..mapping.weights import SyncReport

T = TypeVar("T")


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
    mapping_use: MappingUse | None = None  # what the mapping's rules applied to
    candidate_names: Mapping[str, str] = field(default_factory=dict)  # baseline name -> candidate's
    training: TrainingVerdict | None = None  # a training run's verdict over its steps
    stopped: bool = False  # stopped before step 0 (the sides' plans differ): nothing trained
    to_replay: int | None = None  # a failing run's first divergent step (``step_replay``)
    judging: CaseJudging | None = None  # what was judged (``judged_again``)
    notes: tuple[str, ...] = ()  # lines said once before the verdicts (a wrapper prefix taken off)


@dataclass(frozen=True, kw_only=True)
class FinishInputs:
    """What ``finish`` judges: two traces of a case (the candidate in its own names) and how."""

    name: str
    phases: tuple[Phase, ...]
    baseline: Trace
    candidate: Trace
    table: ToleranceTable
    started: float  # time.perf_counter() when the case started
    mapping: MappingSpec | None = None
    case: CaseSpec | None = None  # its ``expect:`` (None: no known divergence)
    sync: SyncReport | None = None
    environment: Mapping[str, Any] = field(default_factory=dict)
    isolated: Comparison | None = None  # isolation mode's per-module compare
    progress: Callable[[int, int], None] | None = None
    workers: int | None = None  # compare threads (None: compare_workers())
    check_mapping: bool = True  # False: the caller checks the rules applied over several finishes
    min_coverage: float | None = None  # the coverage floor (None: the case's, else the default)
    # The parameters after each step judged on their inputs (``update_check``), given the
    # comparison and both traces (the candidate in the baseline's names); None: by the table.
    judge_steps: Callable[[Comparison, Trace, Trace], Comparison] | None = None
    envelope: CleanReruns | None = None  # the envelope lane's clean reruns (None: the table's lanes)
    replay: Replay = None  # why the case's steps are not replayed (None: nothing to say)

    @classmethod
    def of_case(
        cls, case: CaseSpec, traces: tuple[Trace, Trace], table: ToleranceTable, started: float
    ) -> FinishInputs:
        """The two traces of ``case`` (its name, phases, mapping and ``expect:``) judged under
        ``table``; the rest by ``dataclasses.replace``."""
        return cls(
            name=case.name,
            phases=case.phases,
            baseline=traces[0],
            candidate=traces[1],
            table=table,
            started=started,
            mapping=case.mapping,
            case=case,
        )


def finish(job: FinishInputs) -> CaseRun:
    """Map the candidate to the baseline's names, compare, and judge the case (one call of
    ``judge_case``). A mapping rule that applied to no record (nor, with weight sync,
    parameter) is a ``ConfigError``."""
    cand_in, peft_reasons = peft_aligned(job.baseline, job.candidate)  # a LoRA run vs a plain one
    facts = case_facts(job.baseline, cand_in)  # the manifests read once, for all that follows
    # Two recordings of a run in other modes or on other steps: compared on what both hold.
    both = on_both(job.baseline, cand_in, facts)
    base_trace, cand_in = both.baseline, both.candidate
    mapped = map_trace(cand_in, base_trace, job.mapping)
    synced = job.sync.applied if job.sync is not None else frozenset()
    use = MappingUse.of(job.mapping, cand_in, mapped.applied | synced, params_seen=job.sync is not None)
    if job.check_mapping:
        check_applied(use)
    reasons = {**peft_reasons, **_not_recordable(facts), **mapped.reasons}
    reasons.update(dp_unpaired(facts))
    reasons.update(_partial_step_reasons(base_trace, mapped.trace, facts))
    moe = job.case.record.moe if job.case is not None else None
    base_trace, cand_trace = without_lone_replica_grads(base_trace, mapped.trace)
    base_trace = with_merged(base_trace, mapped.baseline_merged)  # parts fused on the candidate's side
    if moe is not None:  # expert records keyed by token, not by dispatch order
        keyed = by_token(base_trace, cand_trace, moe)
        base_trace, cand_trace = keyed.baseline, keyed.candidate
        reasons.update(keyed.reasons)
    comparison = compare_traces(
        base_trace, cand_trace, job.table, reasons, job.progress, job.workers or compare_workers()
    )
    comparison = settle_op_pairs(comparison, base_trace, cand_trace)
    if job.judge_steps is not None and "step" in job.phases:
        comparison = job.judge_steps(comparison, base_trace, cand_trace)
    judging = _judging(job, facts, both, base_trace, cand_trace, comparison)
    unjudged = CaseRun(
        name=job.name,
        phases=job.phases,
        baseline=base_trace,
        candidate=cand_trace,
        sync=job.sync,
        seconds=time.perf_counter() - job.started,
        table=job.table.name,
        environment=job.environment,
        mapping_use=use,
        candidate_names=mapped.candidate_names,
        comparison=comparison,
        verdicts={},
        judging=judging,
    )
    return _judged(unjudged)


def _judging(
    job: FinishInputs,
    facts: CaseFacts,
    both: OnBoth,
    baseline: Trace,
    candidate: Trace,
    comparison: Comparison,
) -> CaseJudging:
    """What ``judge_case`` judges of ``job``: its facts, the traces compared and their comparison."""
    return CaseJudging(
        facts,
        job.phases,
        baseline,
        candidate,
        comparison,
        job.table,
        job.case.expect if job.case is not None else None,
        functools.partial(baseline_param_names, job.mapping),
        job.isolated,
        _floor(job),
        job.envelope,
        both.recorded,
        both.alone,
        both.split,
        job.replay,
        both.not_recorded,
    )


def judged_again(run: CaseRun, replay: Replay) -> CaseRun:
    """``run`` judged again with what the replay of its first divergent step found, or why it
    was not replayed (its traces and comparison as they were)."""
    assert run.judging is not None
    return _judged(replace(run, judging=replace(run.judging, replay=replay)))


def _judged(run: CaseRun) -> CaseRun:
    """``run`` with the verdicts of its ``judging`` (one call of ``judge_case``)."""
    assert run.judging is not None
    verdicts = judge_case(run.judging)
    return replace(
        run,
        comparison=verdicts.comparison,
        verdicts=verdicts.phases,
        training=verdicts.training,
        stopped=verdicts.stopped,
        to_replay=verdicts.to_replay,
    )


def dp_unpaired(facts: CaseFacts) -> dict[str, str]:
    """Why a record has no partner when a side's DP replicas could not be joined on it
    (``parallel.dp_join``: partial grads, hashes, other shapes beyond the batch), or its DTensor
    tensor-parallel ranks not merged (``parallel.dtensor_rules``)."""
    reasons: dict[str, str] = {}
    for side in (facts.baseline, facts.candidate):
        for rid, why in side.tp_unmerged.items():
            reasons[rid] = f"the {side.side}'s TP ranks are not merged on it: {why}"
        for rid, why in side.dp_unpaired.items():
            reasons[rid] = f"the {side.side}'s DP replicas are not joined on it: {why}"
    return reasons


def _not_recordable(facts: CaseFacts) -> dict[str, str]:
    """Why a record has no partner when the other side could not record it (a grad of a view
    modified in place that cannot be read out of its base's grad; see the recorder)."""
    return {
        rid: f"the {side.side}'s grad is {why}"
        for side in (facts.baseline, facts.candidate)
        for rid, why in side.not_recordable.items()
    }


class PerCase(Generic[T]):
    """Each case computed once for all its phase items, and freed after the last of them.

    ``take(key, uses, compute)`` computes on the first call for ``key`` and returns (or
    raises, for a ``PrecalignError``) the same result on the next ``uses - 1`` calls; then the
    result is dropped, so a case's traces do not outlive its items."""

    def __init__(self) -> None:
        self._held: dict[str, T | PrecalignError] = {}
        self._left: dict[str, int] = {}

    def take(self, key: str, uses: int, compute: Callable[[], T]) -> T:
        if key not in self._held:
            try:
                self._held[key] = compute()
            except PrecalignError as exc:
                self._held[key] = exc
            self._left.setdefault(key, uses)
        result = self._held[key]
        self._left[key] = self._left.get(key, 1) - 1
        if self._left[key] <= 0:
            del self._held[key], self._left[key]
        if isinstance(result, PrecalignError):
            raise result
        return result

    def __len__(self) -> int:
        return len(self._held)


def _floor(job: FinishInputs) -> float:
    """The coverage floor: the job's (``--min-coverage``), else its case's ``min_coverage``."""
    if job.min_coverage is not None:
        return job.min_coverage
    return job.case.min_coverage if job.case is not None else DEFAULT_MIN_COVERAGE


def _partial_step_reasons(baseline: Trace, candidate: Trace, facts: CaseFacts) -> dict[str, str]:
    """Records of a step the other side's run left incomplete: why they have no partner."""
    out = {}
    for mine, other, side in (
        (baseline, facts.candidate, "candidate"),
        (candidate, facts.baseline, "baseline"),
    ):
        partial = {m.step for m in other.incomplete_steps}
        for rec in mine.records if partial else ():
            if rec.step in partial:
                out[rec.id] = f"step {rec.step} is incomplete on the {side} side (its run was interrupted)"
    return out
