"""Outcomes as data: a finished case (``CaseRun``) and what one test item came to
(``ItemOutcome``). No models, no torch import, no pytest: the plugin records an item's
outcome and raises its failure, the CLI prints it and picks the exit code.

``finish`` (map, compare, then one call of ``verdict.case_verdict.judge_case``) is shared by
live cases, stored baselines, dump cases, the search and offline compares; ``judged_again``
judges a finished case again with what the replay of its first divergent step found. ``run``
never finishes a verdict itself. ``PerCase`` is the "run a case once for all its phase items,
free it after the last" bookkeeping.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..compare.moe_tokens import by_token
from ..compare.op_pairing import settle_op_pairs
from ..compare.pairs import Comparison, compare_traces
from ..compare.tolerances import ToleranceTable
from ..config.specs import CaseSpec
from ..errors import ConfigError, PrecalignError
from ..mapping.apply import map_trace
from ..mapping.peft_names import peft_aligned
from ..mapping.spec import MappingSpec, baseline_param_names
from ..mapping.usage import MappingUse, check_applied
from ..parallel.dp_join import without_lone_replica_grads
from ..reports.document import junit_properties, phase_dict, report_document
from ..reports.text import PhaseReport, failure_message, summary_line
from ..trace.merged_stats import with_merged
from ..trace.records import Trace
from ..verdict.case_verdict import CaseJudging, judge_case
from ..verdict.coverage import DEFAULT_MIN_COVERAGE
from ..verdict.phase import PhaseVerdict
from ..verdict.replay_story import Replay
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


@dataclass(frozen=True)
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


def compare_workers() -> int:
    """Workers comparing tensor pairs: ``PRECALIGN_COMPARE_THREADS``, else the cores that are
    free now (``free_cores(cores, busy_now())``), at least 1, at most 4. Threads, or forked
    processes where that is safe (``compare.forked_jobs``)."""
    wanted = os.environ.get("PRECALIGN_COMPARE_THREADS", "").strip()
    if wanted:
        if not (wanted.isdigit() and int(wanted) > 0):
            raise ConfigError(
                f"environment variable PRECALIGN_COMPARE_THREADS={wanted!r}: expected a whole number >= 1"
            )
        return int(wanted)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return free_cores(cores, busy_now())


def busy_now(samples: int = 5, loadavg: str = "/proc/loadavg") -> float:
    """How many cores other work keeps busy now: the fewest runnable tasks seen in ``samples``
    reads of ``loadavg`` 1 ms apart (its fourth field, ``running/total``), less this one. The
    fewest: work that keeps a core busy is runnable in every read, a short task (a shell, a
    kernel thread) in few. Without that file, the 1-minute load average, which lags: right
    after another program's burst (the benchmark's msprobe compare) it still reads ~2 on an
    idle 2-core machine."""
    seen: int | None = None
    for n in range(samples):
        try:
            with open(loadavg, encoding="ascii") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            seen = None
            break
        seen = running if seen is None else min(seen, running)
        if n + 1 < samples:
            time.sleep(0.001)
    if seen is not None and seen >= 1:
        return float(seen - 1)
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def free_cores(cores: int, load: float) -> int:
    """Compare workers for ``cores`` usable cores while ``load`` of them are busy: the cores not
    busy (``cores - round(load)``), at least 1, at most 4.

    A worker on a core another process keeps busy only takes turns with it: on 2 cores at
    load ~1 a second compare thread made the 1 GB compare slower (0.78-0.85 s against
    0.67-0.69 s with one; CPU seconds equal to wall seconds with two, i.e. no overlap).
    ``PRECALIGN_COMPARE_THREADS`` overrides."""
    busy = int(load + 0.5) if load == load and load >= 0 else 0
    return max(1, min(4, cores - busy))


def finish(job: FinishInputs) -> CaseRun:
    """Map the candidate to the baseline's names, compare, and judge the case (one call of
    ``judge_case``). A mapping rule that applied to no record (nor, with weight sync,
    parameter) is a ``ConfigError``."""
    # Two recordings of a run in other modes or on other steps: compared on what both hold.
    both = on_both(job.baseline, job.candidate)
    base_trace = both.baseline
    cand_in, peft_reasons = peft_aligned(base_trace, both.candidate)  # a LoRA run vs a plain one
    mapped = map_trace(cand_in, base_trace, job.mapping)
    synced = job.sync.applied if job.sync is not None else frozenset()
    use = MappingUse.of(job.mapping, cand_in, mapped.applied | synced, params_seen=job.sync is not None)
    if job.check_mapping:
        check_applied(use)
    reasons = {**peft_reasons, **_not_recordable(base_trace, mapped.trace), **mapped.reasons}
    reasons.update(dp_unpaired(base_trace, mapped.trace))
    reasons.update(_partial_step_reasons(base_trace, mapped.trace))
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
    judging = _judging(job, both, base_trace, cand_trace, comparison)
    return CaseRun(
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
        **_judged(judging),
    )


def _judging(
    job: FinishInputs, both: OnBoth, baseline: Trace, candidate: Trace, comparison: Comparison
) -> CaseJudging:
    """What ``judge_case`` judges of ``job``: the traces compared and their comparison."""
    return CaseJudging(
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
    return replace(run, **_judged(replace(run.judging, replay=replay)))


def _judged(judging: CaseJudging) -> dict[str, Any]:
    """A ``CaseRun``'s fields of its verdicts: ``judging`` judged (one call of ``judge_case``)."""
    verdicts = judge_case(judging)
    return {
        "comparison": verdicts.comparison,
        "verdicts": verdicts.phases,
        "training": verdicts.training,
        "stopped": verdicts.stopped,
        "to_replay": verdicts.to_replay,
        "judging": judging,
    }


def dp_unpaired(baseline: Trace, candidate: Trace) -> dict[str, str]:
    """Why a record has no partner when a side's DP replicas could not be joined on it
    (``parallel.dp_join``: partial grads, hashes, other shapes beyond the batch), or its
    DTensor tensor-parallel ranks not merged (``parallel.dtensor_rules``)."""
    reasons: dict[str, str] = {}
    for side, trace in (("baseline", baseline), ("candidate", candidate)):
        for rid, why in trace.notes.tp_unmerged.items():
            reasons[str(rid)] = f"the {side}'s TP ranks are not merged on it: {why}"
        for block in trace.notes.dp_join.values():
            for rid, why in block.get("unpaired", {}).items():
                reasons[str(rid)] = f"the {side}'s DP replicas are not joined on it: {why}"
    return reasons


def _not_recordable(baseline: Trace, candidate: Trace) -> dict[str, str]:
    """Why a record has no partner when the other side could not record it (a grad of a view
    modified in place that cannot be read out of its base's grad; see the recorder)."""
    reasons: dict[str, str] = {}
    for side, trace in (("baseline", baseline), ("candidate", candidate)):
        for rid, why in trace.notes.not_recordable.items():
            reasons[rid] = f"the {side}'s grad is {why}"
    return reasons


@dataclass(frozen=True)
class ItemOutcome:
    """What one test item (a case and a phase, or a case's search) came to."""

    name: str  # "<case>[<phase>]"
    passed: bool
    message: str = ""  # the failure, as the item shows it ("" when passed)
    summary: str = ""  # the line of the terminal summary ("" for none)
    entry: Mapping[str, Any] | None = None  # the report.json entry, plain JSON values (None: none)
    properties: tuple[tuple[str, object], ...] = ()  # JUnit <property>s


def phase_outcome(report: PhaseReport, extra: Mapping[str, Any] | None = None) -> ItemOutcome:
    """A case's phase judged against a live (or dump, or offline) baseline; ``extra`` keys are
    added to its report entry."""
    data = {**phase_dict(report), **(extra or {})}
    return ItemOutcome(
        name=report.nodeid_name,
        passed=report.passed,
        message="" if report.passed else failure_message(report),
        summary=summary_line(report),
        entry=plain_entry(data),
        properties=tuple(junit_properties(report.verdict)),
    )


def plain_entry(data: Mapping[str, Any]) -> dict[str, Any]:
    """A report entry in plain JSON values (it rides on xdist's test reports)."""
    return report_document([data], {})["cases"][0]  # type: ignore[no-any-return]


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


def _partial_step_reasons(baseline: Trace, candidate: Trace) -> dict[str, str]:
    """Records of a step the other side's run left incomplete: why they have no partner."""
    out = {}
    for mine, other, side in ((baseline, candidate, "candidate"), (candidate, baseline, "baseline")):
        partial = {int(m["step"]) for m in other.notes.incomplete_steps}
        for rec in mine.records if partial else ():
            if rec.step in partial:
                out[rec.id] = f"step {rec.step} is incomplete on the {side} side (its run was interrupted)"
    return out
