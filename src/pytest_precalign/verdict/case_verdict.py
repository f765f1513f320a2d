"""A case's verdicts in one call (``judge_case``): what ``run`` compared goes in, every verdict
of the case comes out complete.

In (``CaseJudging``): the two traces (the candidate in the baseline's names), their
comparison, the table, the case's expectation, and what the run found beside the comparison
(isolation, the envelope, the steps not compared because one side lacks them, and the
replay of the first divergent step). Out (``CaseVerdicts``): each phase's verdict with every fail-closed
finding (coverage, a phase judged by the run's scalars, ranks that disagreed, parameter grads
that were gone, a run interrupted mid-step) and the case's story, and the training run's
verdict (frozen parameters checked unchanged, the expected divergence checked, the replay
told). The manifests are read once (``case_facts``).

A case stopped before step 0 (``run.contract_check``: its traces hold the two sides' plans and
``not_trained``) is judged on its plans: when they differ (``check_contract``) every phase
carries the run verdict (``stopped``); when they agree nothing is judged and the case trains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..compare.pairs import Comparison
from ..compare.tolerances import ToleranceTable
from ..trace.records import Trace
from ..vocabulary import Phase
from .case_facts import CaseFacts, case_facts
from .coverage import DEFAULT_MIN_COVERAGE
from .dp_replicas import with_replica_findings
from .dp_rows import with_replica_rows
from .expectation import Expectation
from .frozen_params import without_frozen
from .phase import (
    PhaseVerdict,
    phase_verdict,
    with_incomplete_steps,
    with_missing_grads,
    with_replica_mismatches,
)
from .replay_story import Replay, with_replay
from .story import tell_case
from .training_contract import Rename, check_contract, same_names
from .training_envelope import CleanReruns, measure_envelope
from .training_run import TrainingVerdict, lane_of, with_expectation
from .training_traces import judge_traces, judged_by_scalars


@dataclass(frozen=True)
class CaseJudging:
    """What ``judge_case`` judges (see the module doc)."""

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
    not_recorded: Mapping[str, str] = field(default_factory=dict)  # kind -> why one side has none


@dataclass(frozen=True)
class CaseVerdicts:
    """Every verdict of a case, complete."""

    phases: Mapping[Phase, PhaseVerdict]
    training: TrainingVerdict | None  # a training run's verdict over its steps
    comparison: Comparison  # what was judged (the parameters both sides freeze taken out)
    stopped: bool = False  # stopped before step 0: the plans differ, nothing was trained
    to_replay: int | None = None  # a failing run's first divergent step (what a replay drills into)


def judge_case(judging: CaseJudging) -> CaseVerdicts:
    """The case's verdicts (module doc)."""
    facts = case_facts(judging.baseline, judging.candidate)
    # parameters both runs freeze (a LoRA run's base weights) are checked unchanged, not judged
    comparison = without_frozen(judging.comparison, facts.baseline.frozen & facts.candidate.frozen)
    if facts.not_trained and not _plans_differ(facts, judging.rename):
        return CaseVerdicts({}, None, comparison)  # the plans agree: the case trains
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
    training = _training(judging, facts, comparison)
    if facts.not_trained:
        return _stopped(judging, facts, comparison, verdicts, training)
    training = with_replay(training, judging.replay)
    first = training.first if training is not None else None
    data = (first.step, first.evidence) if first is not None and first.what == "data" else None
    told = tell_case(verdicts, phases, data)  # no module origin where the data differs
    failing = first is not None and training is not None and not training.passed
    return CaseVerdicts(told, training, comparison, to_replay=first.step if failing and first else None)


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
    if expect is None or expect.diverged is None or expect.step is None:
        return training
    if training is None:
        training = TrainingVerdict(0, lane_of(judging.table), None, ("the case is not a training run",))
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


def _plans_differ(facts: CaseFacts, rename: Rename) -> bool:
    base, cand = facts.baseline.run.plan, facts.candidate.run.plan
    return base is not None and cand is not None and check_contract(base, cand, rename) is not None


def _stopped(
    judging: CaseJudging,
    facts: CaseFacts,
    comparison: Comparison,
    verdicts: Mapping[Phase, PhaseVerdict],
    training: TrainingVerdict | None,
) -> CaseVerdicts:
    """A case judged on its plans alone: every phase carries the run verdict (nothing was
    recorded, so no phase is judged on records nor on coverage)."""
    run = training or _judge_run(judging, facts, comparison)
    phases = {phase: replace(v, passed=run.passed, coverage=None) for phase, v in verdicts.items()}
    return CaseVerdicts(phases, run, comparison, stopped=True)


def _incomplete_steps(facts: CaseFacts) -> list[str]:
    """The partial steps of a side's run interrupted mid-step (both sides), with what was compared."""
    out = []
    for side in facts.sides:
        steps = ", ".join(str(s) for s in side.notes.steps)
        for m in side.notes.incomplete_steps:
            out.append(f"{m['detail']}: step {m['step']} not compared (steps {steps} compared)")
    return out
