"""The training-run verdict: at which optimizer step two trainings start to differ, in what,
and where in the model.

From each side's per-step scalars (``StepScalars``), its translated settings (the manifest's
``"training"`` plan), its initial parameters, and each step's record evidence
(``training_records``), the first divergent step is the first step at which anything differs,
and what diverged first is judged in the order a step executes: the step's data, the forward,
the loss, the backward (a layer, or every grad scaled by one factor: their reduction),
clipping, the LR / weight decay as applied, the optimizer's update. Before step 0: the
initial weights and the contract (``training_contract``). Every later step is downstream.

Three lanes: ``exact`` (the case's table allows no difference: scalars must be bitwise equal),
``approximate`` (each scalar under the table's tolerance for its kind) and ``envelope`` (each
scalar under a multiple of its spread over clean reruns of the baseline, ``steps_over`` steps
allowed above it: ``training_envelope``). The run fails
closed: steps one side lacks, a scalar one side records and the other does not, an update
one side skipped are findings, never silently paired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..compare.tolerances import ToleranceTable
from ..trace.step_scalars import StepScalars
from ..trace.training_record import RunRecord, split_free
from ..vocabulary import Lane, Phase, TrainingClass
from .model_output import output_grad_pattern
from .not_compared import NotCompared
from .replay_finding import Replay
from .run_evidence import (
    GradNormOverOtherGrads,
    GradsChanged,
    GradsOneSided,
    GradsScaled,
    InitialParamsDiffer,
    LayerDiffers,
    LossGradDiffers,
    LossRecordDiffers,
    MicroBatchesDiffer,
    MovedBefore,
    OutputGradDiffers,
    PlansDiffer,
    RunEvidence,
    ScalarsDiffer,
    UpdateDiffers,
)
from .run_findings import BEFORE_TRAINING, PlanMissing, RecordedOneSide, RunFinding, RunWarning
from .run_patterns import (
    ClippedPerMicroBatch,
    EveryParamUpdated,
    GradNormOverOthers,
    GradsChangedAfterBackward,
    GradsOnOneSide,
    GradsScaledBy,
    LossFunctionDiffers,
    MicroBatchSplit,
    RunPattern,
)
from .story import origin_of
from .training_contract import (
    ContractDiff,
    Rename,
    lr_pattern,
    same_names,
    unsaid_settings,
)
from .training_envelope import Envelope, EnvelopeJudged
from .training_records import StepRecords
from .training_scalars import (
    ScalarDiff,
    ScalarJudge,
    findings_of,
    first_scalar_difference,
    layers_clear_forward,
    losses_differ_since,
    nonfinite_on_both,
    one_sided,
    over_envelope,
)
from .training_settings import judge_plans


@dataclass(frozen=True)
class FirstDivergent:
    step: int
    what: TrainingClass
    origin: str  # a module, a parameter or a scalar's name
    evidence: RunEvidence  # why: its words are made when rendered (reports.training_evidence_text)
    pattern: RunPattern | None = None  # a whole-model pattern (words: ``reports.run_pattern_text``)


@dataclass(frozen=True)
class ExpectedRun:
    """The case's known run divergence the verdict was checked against (``with_expectation``)."""

    step: int
    what: TrainingClass
    origin: str | None = None  # None: any origin


@dataclass(frozen=True)
class TrainingVerdict:
    steps_compared: int
    lane: Lane
    first: FirstDivergent | None
    findings: tuple[RunFinding, ...] = ()  # what the run could not pair (fails the case)
    last_step: int = 0
    curves: Mapping[str, Any] = field(default_factory=dict)  # per-step scalars of both sides
    replay: Replay = None  # what the replay of the first divergent step found, or why it did not run
    expected: ExpectedRun | None = None  # the case's expected divergence, checked (``with_expectation``)
    met: bool | None = None  # None: no expectation
    envelope: EnvelopeJudged | None = None  # the envelope lane's envelope and the steps over it
    unsaid: tuple[str, ...] = ()  # plan settings one side did not say: not compared (contract)
    recorded_with: tuple[str, ...] = ()  # each side's recorder (``training.trainer``), for hints
    warnings: tuple[RunWarning, ...] = ()  # what passed only because the table opted in (equal_nan)
    # What one side recorded and the other did not: ``layers`` (steps whose layers only that
    # side recorded: not compared, no finding), ``steps`` and ``scalars`` (findings), by side.
    one_side_only: Mapping[str, Any] = field(default_factory=dict)
    not_compared: tuple[NotCompared, ...] = ()  # what was not compared because one side lacks it

    @property
    def passed(self) -> bool:
        found_right = self.first is None if self.met is None else self.met
        return found_right and not self.findings


def lane_of(table: ToleranceTable) -> Lane:
    """``exact`` when the table's every rule allows no difference (atol = rtol = 0)."""
    rules = table.rules
    exact = bool(rules) and all(r.atol == 0 and r.rtol == 0 and not r.bounds for r in rules)
    return "exact" if exact else "approximate"


def judge_run(
    baseline: RunRecord,
    candidate: RunRecord,
    records: Mapping[int, StepRecords],
    table: ToleranceTable,
    rename: Rename = same_names,
    dtype: str = "float32",
    envelope: Envelope | None = None,
) -> TrainingVerdict:
    """The run's verdict (see the module docstring); ``dtype``: the runs' (for the table);
    ``envelope``: judge in the envelope lane."""
    lane: Lane = "envelope" if envelope is not None else lane_of(table)
    free = split_free(baseline.plan, candidate.plan)
    judge, told = _judge(ScalarJudge(table, lane, dtype, envelope, split_free=free), baseline, candidate)
    steps = sorted(set(baseline.scalars) | set(candidate.scalars) | set(records))
    broken, warnings = nonfinite_on_both(baseline.scalars, candidate.scalars, judge)
    findings = (
        findings_of(baseline.scalars, candidate.scalars) + one_sided_evidence(baseline, candidate) + broken
    )
    common = [s for s in steps if _on_both(s, baseline, candidate, records)]
    first = _before_training(baseline, candidate, judge, rename)
    since = losses_differ_since(baseline.scalars, candidate.scalars)
    for step in common:
        if first is not None and first.step <= step:
            break
        found = _step_first(
            step, baseline.scalars.get(step), candidate.scalars.get(step), records.get(step), judge, since
        )
        if found is not None:
            first = found
            break
    if first is not None and first.what == "schedule" and first.pattern is None:
        first = _run_pattern(first, baseline.scalars, candidate.scalars)
    if first is not None:
        first = _moved_before(first, baseline.scalars, candidate.scalars, judge)
    return TrainingVerdict(
        steps_compared=len(common),
        lane=lane,
        first=first,
        findings=findings,
        last_step=max(common, default=0),
        curves=curves(baseline.scalars, candidate.scalars),
        envelope=told,
        unsaid=_unsaid(baseline, candidate),
        warnings=plan_missing(baseline, candidate) + warnings,
        recorded_with=tuple(s.settings.trainer for s in (baseline, candidate) if s.settings is not None),
        one_side_only=one_sided(baseline.scalars, candidate.scalars),
    )


def one_sided_evidence(baseline: RunRecord, candidate: RunRecord) -> tuple[RecordedOneSide, ...]:
    """Evidence one side recorded and the other did not: each a finding that says so, never a
    check skipped in silence (evidence of the wrong shape never gets here: ``read_run_record``
    refuses it, naming the file and the key)."""
    out: list[RecordedOneSide] = []
    for key in BEFORE_TRAINING:
        held = [bool(getattr(run, key)) for run in (baseline, candidate)]
        if held[0] != held[1]:
            out.append(RecordedOneSide(key, "baseline" if held[0] else "candidate"))
    return tuple(out)


def plan_missing(baseline: RunRecord, candidate: RunRecord) -> tuple[PlanMissing, ...]:
    """A side whose recorder could not write its plan (``TrainingSettings.plan_missing``),
    said in every compare of it, whatever the other side holds."""
    return tuple(
        PlanMissing(side, run.settings.plan_missing)
        for side, run in (("baseline", baseline), ("candidate", candidate))
        if run.settings is not None and run.settings.plan_missing
    )


def _judge(
    judge: ScalarJudge, baseline: RunRecord, candidate: RunRecord
) -> tuple[ScalarJudge, EnvelopeJudged | None]:
    """In the envelope lane: the steps over the envelope forgiven when ``steps_over`` allows
    them all, and the envelope with the steps over it."""
    envelope = judge.envelope
    if envelope is None:
        return judge, None
    over = over_envelope(baseline.scalars, candidate.scalars, judge)
    allowed = envelope.spec.steps_over
    told = EnvelopeJudged(envelope.spec.reruns, envelope.widest(), tuple(over), allowed)
    return (replace(judge, forgiven=frozenset(over)) if len(over) <= allowed else judge), told


def _run_pattern(
    first: FirstDivergent, base: Mapping[int, StepScalars], cand: Mapping[int, StepScalars]
) -> FirstDivergent:
    """A schedule difference told by the whole run's LRs (one side lagging, another horizon)."""
    steps = sorted(set(base) & set(cand))
    seqs = [[s.lr[0] if s.lr else 0.0 for s in (side[k] for k in steps)] for side in (base, cand)]
    pattern = lr_pattern(seqs[0], seqs[1]) if first.origin.startswith("lr") else None
    return replace(first, pattern=pattern) if pattern is not None else first


# Classes a smaller move of an earlier step can explain (not the data, settings, weights or
# schedule, each found at its step by its own evidence).
_AFTER_A_MOVE = ("forward", "loss", "backward", "forward_or_backward", "clipping", "grad_reduction")


# The per-step scalars a step computes, in order, and the class a first move of each names.
_MOVES: tuple[tuple[str, TrainingClass], ...] = (
    ("loss", "forward"),
    ("grad_norm", "backward"),
    ("update_norm", "optimizer_update"),
)


def _moved_before(
    first: FirstDivergent,
    base: Mapping[int, StepScalars],
    cand: Mapping[int, StepScalars],
    judge: ScalarJudge,
) -> FirstDivergent:
    """Where the runs part, when that is before ``first``: in the approximate lane every scalar
    has a tolerance, so a change smaller than it (a loss, or an update norm, which this lane does
    not judge) may come steps before the first that exceeds one. Where the runs' first steps
    were bitwise equal in loss, grad norm and update norm (the sides compute alike, as a rerun
    on one stack does), the first step after them where one of those moved at all is where the
    runs part: told at that step, by the first scalar that moved (the loss: the forward; the
    grad norm: the backward; the update norm: the optimizer's update), ``first`` as what followed."""
    if judge.lane != "approximate" or first.what not in _AFTER_A_MOVE:
        return first
    for step in range(first.step):
        a, b = base.get(step), cand.get(step)
        if a is None or b is None:
            return first
        moved = [
            (name, what, getattr(a, name), getattr(b, name))
            for name, what in _MOVES
            if getattr(a, name) is not None
            and getattr(b, name) is not None
            and getattr(a, name) != getattr(b, name)
        ]
        if not moved:
            continue
        if step == 0:
            return first  # nothing before it was bitwise equal: the sides may compute differently
        name, what, x, y = moved[0]
        evidence = MovedBefore(name, x, y, step, first.step, first.what, first.origin)
        return FirstDivergent(step, what, name, evidence)
    return first


def _on_both(
    step: int, baseline: RunRecord, candidate: RunRecord, records: Mapping[int, StepRecords]
) -> bool:
    if step in baseline.scalars or step in candidate.scalars:
        return step in baseline.scalars and step in candidate.scalars
    return step in records


def _before_training(
    baseline: RunRecord, candidate: RunRecord, judge: ScalarJudge, rename: Rename
) -> FirstDivergent | None:
    """Different initial weights, then a contract difference (at its planned step)."""
    weights = _weights(baseline.initial_params, candidate.initial_params, judge, rename)
    if weights is not None:
        return weights
    diff = judge_plans((baseline.plan, candidate.plan), (baseline.settings, candidate.settings), rename)
    return _contract(diff) if diff is not None else None


def _unsaid(baseline: RunRecord, candidate: RunRecord) -> tuple[str, ...]:
    if baseline.plan is None or candidate.plan is None:
        return ()
    return unsaid_settings(baseline.plan, candidate.plan)


def _contract(diff: ContractDiff) -> FirstDivergent:
    return FirstDivergent(diff.step, "settings", diff.origin, PlansDiffer(diff), diff.pattern)


def _weights(
    base: Mapping[str, Mapping[str, float]] | None,
    cand: Mapping[str, Mapping[str, float]] | None,
    judge: ScalarJudge,
    rename: Rename,
) -> FirstDivergent | None:
    if not base or not cand:
        return None
    # Only one-to-one names: a fused tensor's norm (Megatron's linear_qkv) is not its parts'.
    renamed = {names[0]: stats for name, stats in cand.items() if len(names := rename(name)) == 1}
    differ = []
    for name, stats in base.items():
        other = renamed.get(name)
        if other is None or "norm" not in stats or "norm" not in other:
            continue
        if not judge.same("param_norm", float(stats["norm"]), float(other["norm"])):
            differ.append((name, float(stats["norm"]), float(other["norm"])))
    if not differ:
        return None
    name, a, b = differ[0]
    return FirstDivergent(0, "weights", name, InitialParamsDiffer(name, a, b, len(differ) - 1))


def _step_first(
    step: int,
    base: StepScalars | None,
    cand: StepScalars | None,
    records: StepRecords | None,
    judge: ScalarJudge,
    since: int | None = None,
) -> FirstDivergent | None:
    """What diverged first in ``step``, in execution order (None: the step is aligned);
    ``since``: the first step whose losses differ (``losses_differ_since``)."""
    rec = records or StepRecords(step)
    scalar = first_scalar_difference(base, cand, judge) if base and cand else None
    if base and cand:
        scalar = layers_clear_forward(scalar, base, cand, rec, judge.lane, since)
    order: list[tuple[TrainingClass, FirstDivergent | None]] = [
        ("data", _scalar_as(step, scalar, "data")),
        ("settings", _split(step, rec) or _scalar_as(step, scalar, "settings")),
        ("forward", _layer(step, rec, "forward")),
        ("loss", _loss(step, rec, scalar) or _loss_grad_only(step, rec, base, cand, judge)),
        (
            "backward",
            _grads_one_sided(step, rec)
            or _after_backward(step, rec, base, cand, scalar, judge.lane)
            or _backward(step, rec, scalar),
        ),
        ("clipping", _scalar_as(step, scalar, "clipping")),
        ("schedule", _scalar_as(step, scalar, "schedule")),
        ("optimizer_update", _update(step, rec, scalar)),
    ]
    return next((found for _, found in order if found is not None), None)


def _scalar_as(step: int, scalar: ScalarDiff | None, what: TrainingClass) -> FirstDivergent | None:
    if scalar is None or scalar.what != what:
        return None
    return FirstDivergent(step, what, scalar.origin, ScalarsDiffer(scalar), scalar.pattern)


def _split(step: int, rec: StepRecords) -> FirstDivergent | None:
    if rec.calls is None:
        return None
    base, cand = rec.calls
    evidence = MicroBatchesDiffer(step, base, cand)
    return FirstDivergent(step, "settings", "micro_batches", evidence, MicroBatchSplit(base, cand))


def _layer(step: int, rec: StepRecords, phase: Phase) -> FirstDivergent | None:
    first = rec.forward if phase == "forward" else rec.backward
    if first is None:
        return None
    origin = origin_of(first)
    what: TrainingClass = "forward" if phase == "forward" else "backward"
    evidence = LayerDiffers(first.name, first.kind, origin)
    return FirstDivergent(step, what, origin.module or first.name, evidence)


def _loss(step: int, rec: StepRecords, scalar: ScalarDiff | None) -> FirstDivergent | None:
    if rec.loss is not None:
        pair = rec.loss
        check = pair.failing
        told = (
            LossRecordDiffers(check.metric, check.value, check.allowed) if check else LossRecordDiffers(None)
        )
        return FirstDivergent(step, "loss", pair.record.name or "loss", told)
    if rec.loss_grad is not None:
        first = rec.loss_grad
        told_grad = LossGradDiffers(rec.losses_matched, first.name, first.metric, first.value, first.allowed)
        return FirstDivergent(step, "loss", "loss", told_grad, LossFunctionDiffers())
    if scalar is not None and scalar.what == "loss":
        hint = not (rec.diverged or rec.forward)
        return FirstDivergent(step, "loss", "loss", ScalarsDiffer(scalar, hint), scalar.pattern)
    return None


def _loss_grad_only(
    step: int, rec: StepRecords, base: StepScalars | None, cand: StepScalars | None, judge: ScalarJudge
) -> FirstDivergent | None:
    """No loss record: the grad at the model's output differs while the forward and the logged loss matched."""
    found, a, b = rec.output_grad, base.loss if base else None, cand.loss if cand else None
    if found is None or a is None or b is None or not judge.same("loss", float(a), float(b), step):
        return None
    evidence = OutputGradDiffers(found, (float(a), float(b)))
    return FirstDivergent(step, "loss", "loss", evidence, output_grad_pattern(rec.grad_factor))


def _backward(step: int, rec: StepRecords, scalar: ScalarDiff | None) -> FirstDivergent | None:
    if rec.grad_factor is not None:
        f = rec.grad_factor
        evidence = GradsScaled(step, rec.grads_compared, f)
        return FirstDivergent(step, "grad_reduction", "grads", evidence, GradsScaledBy(f))
    found = _layer(step, rec, "backward")
    if found is not None:
        return found
    if scalar is not None and scalar.what in ("backward", "forward_or_backward", "grad_reduction"):
        return FirstDivergent(step, scalar.what, scalar.origin, ScalarsDiffer(scalar), scalar.pattern)
    return None


def _grads_one_sided(step: int, rec: StepRecords) -> FirstDivergent | None:
    """Parameters that got a grad on one side only (``grads_one_sided``)."""
    if not rec.grads_one_sided:
        return None
    evidence = GradsOneSided(step, tuple(rec.grads_one_sided))
    return FirstDivergent(step, "backward", rec.grads_one_sided[0][0], evidence, GradsOnOneSide())


def _after_backward(
    step: int,
    rec: StepRecords,
    base: StepScalars | None,
    cand: StepScalars | None,
    scalar: ScalarDiff | None,
    lane: Lane,
) -> FirstDivergent | None:
    """Grads that left the backward aligned and reached the optimizer otherwise: param grads of
    several modules differ while every activation grad matched (their accumulation, reduction or
    precision; clipping when only one side clipped at the update: the other clipped before
    accumulating), or the grad norm differs while every grad the optimizer was given matched
    (clipping's norm, computed over other grads; not in the envelope lane, which judges the
    grad norm closer than the table judges the grads it is computed from)."""
    if rec.grad_factor is not None or not rec.grads_compared:
        return None
    if rec.grads_changed:
        evidence: RunEvidence = GradsChanged(step, rec.grads_failed, rec.grads_compared)
        clipped = [s.clip_coef < 1.0 for s in (base, cand) if s is not None and s.clip_coef is not None]
        if len(clipped) == 2 and clipped[0] != clipped[1]:
            late, early = ("baseline", "candidate") if clipped[0] else ("candidate", "baseline")
            return FirstDivergent(step, "clipping", "clip_coef", evidence, ClippedPerMicroBatch(late, early))
        return FirstDivergent(step, "grad_reduction", "grads", evidence, GradsChangedAfterBackward())
    if (
        rec.backward is None
        and lane != "envelope"
        and scalar is not None
        and scalar.what == "backward"
        and scalar.origin == "grad_norm"
    ):
        evidence = GradNormOverOtherGrads(scalar, rec.grads_compared)
        return FirstDivergent(step, "clipping", "grad_norm", evidence, GradNormOverOthers())
    return None


def _update(step: int, rec: StepRecords, scalar: ScalarDiff | None) -> FirstDivergent | None:
    first = rec.update
    if first is not None:
        pattern = EveryParamUpdated(rec.params_compared) if rec.every_param else None
        return FirstDivergent(step, "optimizer_update", first.name, UpdateDiffers(first.name), pattern)
    if scalar is not None and scalar.what == "optimizer_update":
        return FirstDivergent(step, "optimizer_update", scalar.origin, ScalarsDiffer(scalar), scalar.pattern)
    return None


CURVE_FIELDS = ("loss", "lr", "grad_norm")


def curves(base: Mapping[int, StepScalars], cand: Mapping[int, StepScalars]) -> dict[str, Any]:
    """The per-step curves of both sides the HTML report draws: loss, LR of group 0, grad norm."""
    steps = sorted(set(base) | set(cand))
    out: dict[str, Any] = {"steps": steps}
    for name in CURVE_FIELDS:
        for side, scalars in (("baseline", base), ("candidate", cand)):
            values = [_curve_value(scalars.get(s), name) for s in steps]
            if any(v is not None for v in values):
                out.setdefault(name, {})[side] = values
    return out


def _curve_value(s: StepScalars | None, name: str) -> float | None:
    if s is None:
        return None
    value = getattr(s, name)
    if isinstance(value, tuple):
        return float(value[0]) if value else None
    return None if value is None else float(value)


# The phase whose test item a training verdict fails: where its class happens in a step.
PHASE_OF_CLASS: Mapping[TrainingClass, Phase] = {
    "weights": "forward",
    "settings": "forward",
    "data": "forward",
    "forward": "forward",
    "loss": "forward",
    "backward": "backward",
    "forward_or_backward": "forward",
    "grad_reduction": "backward",
    "clipping": "step",
    "schedule": "step",
    "optimizer_update": "step",
}


def owning_phase(verdict: TrainingVerdict, phases: Sequence[Phase]) -> Phase | None:
    """The case phase that carries a failing training verdict: its class's phase when the
    case runs it, else the case's first phase (a run that does not line up: the first)."""
    if verdict.passed or not phases:
        return None
    what = verdict.first.what if verdict.first is not None else None
    if verdict.expected is not None:
        what = verdict.expected.what
    wanted = PHASE_OF_CLASS[what] if what is not None else phases[0]
    return wanted if wanted in phases else phases[0]


def with_expectation(
    verdict: TrainingVerdict, step: int, diverged: TrainingClass, origin: str | None = None
) -> TrainingVerdict:
    """The verdict checked against a known divergence: met only when the first divergent step,
    what diverged first (and the origin, when given) are exactly these."""
    first = verdict.first
    met = first is not None and (first.step, first.what) == (step, diverged)
    if origin is not None:
        met = met and first is not None and first.origin == origin
    return replace(verdict, expected=ExpectedRun(step, diverged, origin), met=met)
