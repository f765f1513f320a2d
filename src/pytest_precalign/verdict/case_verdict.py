"""A case's verdicts in one call (``judge_case``): what ``run`` compared goes in, every verdict
of the case comes out complete.

In (``CaseJudging``): the case's facts (``case_facts``, gathered once by ``run.outcome.finish``),
the two traces (the candidate in the baseline's names), their comparison, the table, the case's
expectation, and what the run found beside the comparison (isolation, the envelope, the steps
not compared because one side lacks them, and the replay of the first divergent step). Out
(``CaseVerdicts``): each phase's verdict with every fail-closed finding (coverage, a phase
judged by the run's scalars, ranks that disagreed, parameter grads that were gone, a run
interrupted mid-step) and the case's story, and the training run's verdict (frozen parameters
checked unchanged, the expected divergence checked, the replay told).

A case whose sides' plans differ (``training_settings.judge_plans``, the one predicate, also
judged at step 0 of the run verdict) is stopped before step 0 (``run.contract_check``): its
verdicts are ``judge_stopped``'s, from the two plans alone, nothing trained or recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..compare.pairs import Comparison
from ..compare.tolerances import ToleranceTable
from ..specs.coverage import DEFAULT_MIN_COVERAGE
from ..specs.expectation import Expectation
from ..trace.records import Trace
from ..trace.training_record import RunRecord, TrainingSettings
from ..vocabulary import Phase
from .case_facts import CaseFacts
from .dp_replicas import with_replica_findings
from .dp_rows import with_replica_rows
from .frozen_params import without_frozen
from .not_compared import KindsNotRecorded
from .phase import PartialStep, PhaseVerdict, phase_verdict
from .phase_notes import with_incomplete_steps, with_missing_grads, with_replica_mismatches
from .replay_finding import Replay
from .run_findings import NotTrainingRun
from .story import tell_case
from .tp_ranks import with_tp_rank
from .training_contract import Rename, same_names
from .training_envelope import CleanReruns, measure_envelope
from .training_run import TrainingVerdict, judge_run, lane_of, with_expectation
from .training_settings import judge_plans
from .training_traces import judge_traces, judged_by_scalars


@dataclass(frozen=True)
class CaseJudging:
    """What ``judge_case`` judges (see the module doc)."""

    facts: CaseFacts  # the two traces' manifest facts, gathered once
    phases: tuple[Phase, ...]
    baseline: Trace
    candidate: Trace  # in the baseline's names (its manifest its own)
    comparison: Comparison
    table: ToleranceTable
    expect: Expectation | None = None  # the case's known divergence (None: none)
    rename: Rename = same_names  # a candidate parameter name -> the baseline's names
    isolated: Comparison | None = None  # isolation mode's per-module compare
    min_coverage: float = DEFAULT_MIN_COVERAGE
    envelope: CleanReruns | None = None  # the envelope lane's clean reruns (None: the table's lanes)
    recorded: bool = False  # two recorded runs: a phase neither side recorded is judged by the scalars
    # side -> the steps whose layers only it recorded (not compared)
    alone: Mapping[str, Sequence[int]] = field(default_factory=dict)
    split: Sequence[int] = ()  # steps the sides split into other micro-batches (layers not compared)
    replay: Replay = None  # what the replay of the first divergent step found, or why it did not run
    not_recorded: Mapping[str, KindsNotRecorded] = field(
        default_factory=dict
    )  # kind -> why one side has none


@dataclass(frozen=True)
class CaseVerdicts:
    """Every verdict of a case, complete."""

    phases: Mapping[Phase, PhaseVerdict]
    training: TrainingVerdict | None  # a training run's verdict over its steps
    comparison: Comparison  # what was judged (the parameters both sides freeze taken out)
    stopped: bool = False  # stopped before step 0 (``judge_stopped``): the plans differ, nothing trained
    to_replay: int | None = None  # a failing run's first divergent step (what a replay drills into)


def judge_case(judging: CaseJudging) -> CaseVerdicts:
    """The case's verdicts (module doc)."""
    facts = judging.facts
    # parameters both runs freeze (a LoRA run's base weights) are checked unchanged, not judged
    comparison = without_frozen(judging.comparison, facts.baseline.frozen & facts.candidate.frozen)
    phases = judging.phases
    expect = judging.expect
    mismatches = [m for side in facts.sides for m in side.notes.replica_mismatches]
    missing = {side.side: list(side.notes.grads_missing) for side in facts.sides}
    incomplete = _incomplete_steps(facts)
    verdicts = {}
    for phase in phases:
        earlier = expect is not None and phases.index(expect.phase) < phases.index(phase)
        verdict = phase_verdict(
            comparison, phase, expect, earlier, judging.isolated, facts.parents, judging.min_coverage
        )
        if judging.recorded and not comparison.by_phase(phase):  # neither side recorded this phase
            verdict = judged_by_scalars(verdict, phase)
        verdict = with_replica_mismatches(verdict, mismatches)
        verdict = with_missing_grads(verdict, missing)
        verdicts[phase] = with_incomplete_steps(verdict, incomplete)
    training = with_replay(_training(judging, facts, comparison), judging.replay)
    first = training.first if training is not None else None
    data = (first.step, first.evidence) if first is not None and first.what == "data" else None
    told = tell_case(verdicts, phases, data)  # no module origin where the data differs
    failing = first is not None and training is not None and not training.passed
    return CaseVerdicts(told, training, comparison, to_replay=first.step if failing and first else None)


def judge_stopped(
    phases: tuple[Phase, ...],
    settings: tuple[TrainingSettings | None, TrainingSettings | None],
    table: ToleranceTable,
    expect: Expectation | None = None,
    rename: Rename = same_names,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> CaseVerdicts | None:
    """The verdicts of a case stopped before step 0, from the settings (and plans) each side's
    trainer will train with, or None when they agree by ``judge_plans`` (the case trains). The
    run verdict names the first difference at its planned step; every phase carries it (nothing
    was recorded: no phase is judged on records nor on coverage)."""
    plans = tuple(None if s is None else s.plan for s in settings)
    if judge_plans((plans[0], plans[1]), settings, rename) is None:
        return None
    sides = [RunRecord(side) for side in settings]
    run = judge_run(sides[0], sides[1], {}, table, rename)
    if expect is not None and expect.diverged is not None and expect.step is not None:
        run = with_expectation(run, expect.step, expect.diverged, expect.run_origin)
    nothing = Comparison(())
    verdicts = {}
    for phase in phases:
        earlier = expect is not None and phases.index(expect.phase) < phases.index(phase)
        verdict = phase_verdict(nothing, phase, expect, earlier, None, {}, min_coverage)
        verdicts[phase] = replace(verdict, passed=run.passed, coverage=None)
    return CaseVerdicts(verdicts, run, nothing, stopped=True)


def _training(judging: CaseJudging, facts: CaseFacts, comparison: Comparison) -> TrainingVerdict | None:
    """The run verdict of a training run (None for a one-step case), checked against the
    case's expected run divergence (``expect: {step, diverged}``) when it has one."""
    expect = judging.expect
    training = None
    if expect is not None and expect.diverged is None:
        return None  # a phase's known divergence (expect: {phase, first_divergence}) gates the case
    if facts.training_run:
        mismatches = [m for side in facts.sides for m in side.notes.replica_mismatches]
        training = with_replica_findings(_judge_run(judging, facts, comparison), mismatches)
        training = with_replica_rows(training, judging.baseline, judging.candidate, comparison)
        training = with_tp_rank(training, judging.baseline, judging.candidate)
    return _expected(training, expect, judging.table)


def _expected(
    training: TrainingVerdict | None, expect: Expectation | None, table: ToleranceTable
) -> TrainingVerdict | None:
    """``training`` checked against the case's expected run divergence (``expect: {step,
    diverged}``; as it is without one)."""
    if expect is None or expect.diverged is None or expect.step is None:
        return training
    if training is None:
        training = TrainingVerdict(0, lane_of(table), None, (NotTrainingRun(),))
    return with_expectation(training, expect.step, expect.diverged, expect.run_origin)


def _judge_run(judging: CaseJudging, facts: CaseFacts, comparison: Comparison) -> TrainingVerdict:
    reruns = judging.envelope
    envelope = None
    if reruns is not None:  # each scalar's spread over the baseline's clean reruns
        envelope = measure_envelope(facts.baseline.run.scalars, reruns.scalars, reruns.spec)
    return judge_traces(
        facts,
        judging.baseline,
        judging.candidate,
        comparison,
        judging.table,
        judging.rename,
        envelope,
        judging.alone,
        judging.split,
        judging.not_recorded,
    )


def _incomplete_steps(facts: CaseFacts) -> list[PartialStep]:
    """The partial steps of a side's run interrupted mid-step (both sides), with what was compared."""
    return [PartialStep(m, side.notes.steps) for side in facts.sides for m in side.notes.incomplete_steps]


def with_replay(verdict: TrainingVerdict | None, replay: Replay) -> TrainingVerdict | None:
    """``verdict`` holding the replay of its first divergent step (unchanged when it passed or
    names no step, or there is nothing to hold); told in words when rendered."""
    if replay is None or verdict is None or verdict.first is None or verdict.passed:
        return verdict
    return replace(verdict, replay=replay)
