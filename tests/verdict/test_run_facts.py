"""The training verdict holds facts; its words are made when rendered
(``verdict.run_findings``, ``reports.training_evidence_text``): each fact holds the sides, steps,
names and values its sentence states, the renderer says the sentence, and a verdict built from
facts renders as the terminal and report.json have always said it."""

from __future__ import annotations

import ast
import math
import re
import typing
from dataclasses import replace
from pathlib import Path

from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.reports.contract_evidence_text import contract_evidence_text
from pytest_precalign.reports.envelope_text import envelope_text
from pytest_precalign.reports.run_pattern_text import pattern_text
from pytest_precalign.reports.scalar_evidence_text import scalar_evidence_text
from pytest_precalign.reports.training_evidence_text import evidence_text, finding_text, warning_text
from pytest_precalign.reports.training_json import training_dict
from pytest_precalign.reports.training_text import (
    downstream_text,
    expected_text,
    training_lines,
    training_summary,
)
from pytest_precalign.trace.training_record import RunRecord
from pytest_precalign.verdict import contract_evidence, run_evidence
from pytest_precalign.verdict.contract_evidence import (
    AdapterDiffers,
    ArgumentDiffers,
    Groups,
    LrDiffers,
    LrFrom,
    PrecisionDiffers,
    SetBy,
    SettingDiffers,
)
from pytest_precalign.verdict.model_output import CacheAside, OutputGrad
from pytest_precalign.verdict.run_evidence import (
    GradsScaled,
    InitialParamsDiffer,
    MicroBatchesDiffer,
    MovedBefore,
    RankRows,
    ReplicaRows,
    ScalarsDiffer,
    TpShares,
    told_with,
)
from pytest_precalign.verdict.run_findings import (
    BrokenAlike,
    PlanMissing,
    RecordedOneSide,
    ScalarOneSided,
    StepsOneSided,
    UpdateSkippedOneSide,
)
from pytest_precalign.verdict.run_patterns import (
    ClippedDifferently,
    DecayHorizon,
    LrScaledAtStep,
    MicroBatchSplit,
    OnlyOneClipped,
    ScheduleShifted,
)
from pytest_precalign.verdict.scalar_evidence import BatchDiffers, GradNormDiffers, ScheduleDiffers
from pytest_precalign.verdict.training_envelope import EnvelopeJudged
from pytest_precalign.verdict.training_run import ExpectedRun, TrainingVerdict, judge_run

from .test_rules import first_of, two_layers, verdict
from .test_training_run import judge, run

VERDICT = Path(__file__).parents[2] / "src" / "pytest_precalign" / "verdict"


def test_a_run_that_does_not_line_up_holds_facts_not_sentences() -> None:
    cand = {s: x for s, x in run(grad_norm=lambda s: None, skipped=lambda s: s == 3).items() if s < 8}
    v = judge(run(skipped=lambda s: False), cand)
    assert v.findings == (
        StepsOneSided("baseline", (8, 9)),
        ScalarOneSided("grad_norm", "baseline", tuple(range(8))),
        UpdateSkippedOneSide("candidate", 3),
    )
    assert [finding_text(f) for f in v.findings] == [
        "steps 8-9 recorded by the baseline only: the runs' steps do not line up",
        "grad_norm recorded by the baseline only (steps 0-7): nothing to compare it with",
        "the candidate skipped the update of step 3 (an overflow?), the other did not: the steps after it do "
        "not line up",
    ]


def test_scalars_broken_alike_are_a_finding_with_their_numbers() -> None:
    nan = run(loss=lambda s: math.nan if s >= 7 else 5.0)
    v = judge(nan, nan)
    found = v.findings[0]
    assert isinstance(found, BrokenAlike) and not v.warnings
    assert (found.name, math.isnan(found.value), found.since, found.steps, found.common) == (
        "loss",
        True,
        7,
        3,
        10,
    )
    assert finding_text(v.findings[0]).startswith(
        "loss is nan on both sides from step 7 (3 of 10 step(s)): NaN/Inf"
    )


def test_a_verdict_built_from_facts_renders_as_before() -> None:
    v = TrainingVerdict(
        4,
        "approximate",
        None,
        findings=(RecordedOneSide("plan", "candidate"),),
        warnings=(
            BrokenAlike("loss", math.inf, 2, 2, 4, accepted=True),
            PlanMissing("baseline", "no scheduler"),
        ),
    )
    assert training_lines(v) == [
        "Warning: the baseline's recording has no training plan: no scheduler",
        "Runs do not line up: training plan recorded by the candidate only: the settings (contract) are not "
        "checked before step 0",
        "Warning: loss is inf on both sides from step 2 (2 of 4 step(s)): accepted by the table's equal_nan: true",
    ]
    assert training_summary(v) == (
        "; runs do not line up (1 finding(s): training plan recorded by the candidate only: the settings "
        "(contract) are not checked before step 0)"
    )
    told = training_dict(v)
    assert told["findings"] == [finding_text(v.findings[0])]
    assert told["warnings"] == [warning_text(w) for w in v.warnings]


def test_the_expectation_and_the_steps_downstream_are_said_when_rendered() -> None:
    assert not hasattr(ExpectedRun, "to_text") and not hasattr(TrainingVerdict, "downstream")
    assert expected_text(ExpectedRun(3, "schedule")) == "step 3 schedule"
    warm, behind = [0.0, 5e-4, 1e-3, 1e-3], [0.0, 0.0, 5e-4, 1e-3]
    v = judge(run(lr=lambda s: (warm[min(s, 3)],) * 2), run(lr=lambda s: (behind[min(s, 3)],) * 2))
    v = replace(v, expected=ExpectedRun(1, "schedule", "lr[0]"), met=True)
    assert (downstream_text(v), expected_text(v.expected)) == (
        "steps 2-9 are downstream of it",
        "step 1 (lr[0]) schedule",
    )
    lines = training_lines(v)
    assert "  steps 2-9 are downstream of it" in lines
    assert "  the expected divergence: step 1 (lr[0]) schedule" in lines
    told = training_dict(v)
    assert (told["downstream"], told["expectation"]) == (
        "steps 2-9 are downstream of it",
        "step 1 (lr[0]) schedule",
    )
    assert downstream_text(replace(v, last_step=1)) == ""


def test_the_cache_outputs_set_aside_are_facts_said_as_before() -> None:
    assert typing.get_type_hints(OutputGrad)["aside"] == tuple[CacheAside, ...]
    first = first_of(verdict(two_layers(1.0, 1.0, 2.0), two_layers(1.0, 1.0, 3.0)))
    slot = "out.past_key_values.0.1"
    aside = (
        CacheAside("m", slot, "baseline"),
        *(CacheAside(f"layers.{i}", slot, "candidate") for i in range(4)),
    )
    told = evidence_text(run_evidence.OutputGradDiffers(OutputGrad(first, "b", 4, aside), (2.5, 2.5)))
    assert told.endswith(
        f"; set aside: m {slot} (baseline only), layers.0 {slot} (candidate only), layers.1 {slot} (candidate "
        f"only), layers.2 {slot} (candidate only), ..."
    )


def test_the_first_divergence_holds_its_evidence_as_facts() -> None:
    base = RunRecord(
        scalars=run(), initial_params={"w": {"norm": 1.0}, "b": {"norm": 2.0}, "c": {"norm": 3.0}}
    )
    cand = RunRecord(
        scalars=run(), initial_params={"w": {"norm": 1.0}, "b": {"norm": 2.5}, "c": {"norm": 3.5}}
    )
    v = judge_run(base, cand, {}, default_table())
    assert v.first is not None and v.first.evidence == InitialParamsDiffer("b", 2.0, 2.5, 1)
    assert (
        evidence_text(v.first.evidence)
        == "the initial parameters differ: b norm 2 vs 2.5 and 1 more parameter(s)"
    )
    told = training_dict(v)
    assert told["evidence"] == evidence_text(v.first.evidence) and told["origin"] == "b"


def test_evidence_facts_render_as_the_verdict_said_them() -> None:
    moved = MovedBefore("loss", 5.5, 5.500001, 2, 4, "backward", "grad_norm")
    assert evidence_text(moved) == (
        "the loss moved: 5.5 vs 5.500001 at step 2 (not past a tolerance), after 2 step(s) whose loss, grad "
        "norm and update norm were bitwise equal; step 4 then diverged past a tolerance: backward (grad_norm)"
    )
    assert evidence_text(GradsScaled(3, 12, 2.0)) == "all 12 parameter grads of step 3 differ by the factor 2"
    assert evidence_text(MicroBatchesDiffer(1, 2, 4)) == (
        "every module ran 2 time(s) in step 1 on the baseline, 4 on the candidate"
    )
    tp = TpShares("mlp.down_proj", False, ("rank1",), 1e-3)
    dp = ReplicaRows(
        "candidate", (RankRows("rank0", 0, 2, None), RankRows("rank1", 2, 2, ("allclose", 0.5, 1e-5), False))
    )
    assert evidence_text(told_with(told_with(GradsScaled(3, 12, 2.0), dp), tp)) == (
        "all 12 parameter grads of step 3 differ by the factor 2; the candidate's DP rank(s) rank1 computed it "
        "differently (each replica's rows against the baseline's same rows: DP rank rank0 (rows 0-1 of the "
        "global batch) within tolerance; DP rank rank1 (rows 2-3 of the global batch) differs: allclose 0.5 "
        "(allowed 1e-05)); TP rank1: its partial sum of mlp.down_proj before the all-reduce differs from the "
        "other side's same rank's (max, min, sum or norm beyond 0.001 relative); the other ranks' match"
    )


def test_no_sentence_is_made_for_the_run_verdict_in_verdict() -> None:
    """The run verdict's evidence, findings and warnings are facts: no module of verdict/ that
    makes them builds an f-string for them (the phase verdict's origin claim is a fact too:
    ``test_origin_facts``)."""
    made = [
        f"{path.name}:{n}"
        for path in sorted(VERDICT.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\b(evidence|findings|warnings)\s*(\+?=|=\s*\(?)\s*f[\"']", line)
        or re.search(r"(findings|warnings)\.append\(\s*f[\"']", line)
    ]
    assert made == []


# The calls that make a run verdict's first divergence and the whole-model pattern it carries.
_MADE_BY = {"FirstDivergent", "ScalarDiff", "ContractDiff", "EnvelopeJudged"}
_FACT_FIELDS = {"evidence", "findings", "warnings", "pattern", "envelope", "told"}


def sentences_in_verdict(folder: Path) -> list[str]:
    """Where a module of ``folder`` hands a run verdict a sentence: a string given to a call that
    makes one of its facts, or assigned to a name that holds its evidence, pattern or envelope."""
    made = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            given: list[ast.expr] = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "replace":
                given = [k.value for k in node.keywords if k.arg in _FACT_FIELDS]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in _MADE_BY:
                given = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(getattr(t, "id", None) in _FACT_FIELDS for t in targets) and node.value is not None:
                    given = [node.value]
            made += [f"{path.name}:{e.lineno}" for e in given if _is_words(e)]
    return made


def _is_words(expr: ast.expr) -> bool:
    """A sentence (a string literal or f-string whose text has a space: names and classes have
    none), alone or as a branch of a conditional expression."""
    if isinstance(expr, ast.IfExp):
        return _is_words(expr.body) or _is_words(expr.orelse)
    if isinstance(expr, ast.JoinedStr):
        return any(_is_words(part) for part in expr.values)
    return isinstance(expr, ast.Constant) and isinstance(expr.value, str) and " " in expr.value


def test_no_pattern_or_envelope_is_said_in_verdict() -> None:
    """The first divergence's whole-model pattern and the envelope lane's envelope are facts too:
    no call that makes a run verdict's fact is given a sentence in verdict/."""
    assert sentences_in_verdict(VERDICT) == []


def test_the_pattern_and_the_envelope_hold_their_values_and_say_them_as_before() -> None:
    warm, behind = [0.0, 5e-4, 1e-3, 1e-3], [0.0, 0.0, 5e-4, 1e-3]
    v = judge(run(lr=lambda s: (warm[min(s, 3)],) * 2), run(lr=lambda s: (behind[min(s, 3)],) * 2))
    assert v.first is not None and v.first.pattern == ScheduleShifted(1, behind=True)
    assert training_dict(v)["pattern"] == "the candidate's schedule is 1 step(s) behind the baseline's"
    said = {
        ScheduleShifted(2, behind=False): "the candidate's schedule is 2 step(s) ahead of the baseline's",
        DecayHorizon(None, 8): "same peak, the decay ends at step 8 vs after the last planned step: another "
        "decay horizon",
        MicroBatchSplit(1, 2): "the sides split the step into 1 and 2 micro-batches",
        MicroBatchSplit(1, 2, planned=True): "the sides split each step into 1 and 2 micro-batches",
        OnlyOneClipped("candidate", 0.5): "only the candidate clipped: every grad scaled by one factor (0.5)",
        ClippedDifferently(): "both clipped, by different factors: another threshold or norm",
        LrScaledAtStep(0.5): "every parameter moved by the same factor (LR x0.5): the LR differs",
    }
    assert {fact: pattern_text(fact) for fact in said} == said
    assert pattern_text(None) == "" and envelope_text(None) == ""
    judged = EnvelopeJudged(2, (("loss", 0.0), ("grad_norm", 1.5e-3)), (3, 4), 1)
    assert envelope_text(judged) == (
        "2 clean rerun(s), widest spread per scalar: loss 0, grad_norm 0.0015; steps over it: 3, 4 "
        "(steps_over allows 1)"
    )
    assert envelope_text(EnvelopeJudged(1, (), (), 0)) == (
        "1 clean rerun(s), widest spread per scalar: none recorded; steps over it: none (steps_over allows 0)"
    )


def test_a_scalar_difference_holds_its_values_and_says_them_as_before() -> None:
    v = judge(run(), run(lr=lambda s: (1e-3, 1e-3) if s < 4 else (5e-4, 5e-4)))
    assert v.first is not None and isinstance(v.first.evidence, ScalarsDiffer)
    assert v.first.evidence.scalar.evidence == ScheduleDiffers("lr", 4, 1e-3, 5e-4, 0)
    assert evidence_text(v.first.evidence) == "lr at step 4: 1.000e-03 vs 5.000e-04 (group 0)"
    assert scalar_evidence_text(GradNormDiffers(2.0, 4.0, "summed")) == (
        "grad norm (before clipping) 2 vs 4 while the loss matched"
    )
    assert scalar_evidence_text(BatchDiffers(3, "a" * 64, "b" * 64)) == (
        f"the batch of step 3 differs (sha256 {'a' * 12} vs {'b' * 12})"
    )


def test_a_plan_difference_holds_its_groups_and_arguments_and_says_them_as_before() -> None:
    lr = LrDiffers(1, 5e-4, 0.0, Groups(0, 0, None, by_position=True))
    assert contract_evidence_text(lr) == (
        "lr at step 1: 5.000e-04 vs 0.000e+00 (group 0: baseline group 0, candidate group 0) (parameter names "
        "did not pair through the mapping: groups compared by position)"
    )
    told = SetBy((ArgumentDiffers("lr_scheduler_type", "cosine", "linear"),), LrFrom(3, 4.81e-3, 4.375e-3))
    assert contract_evidence_text(told) == (
        "lr_scheduler_type cosine vs linear: LR differs from step 3 (4.810e-03 vs 4.375e-03)"
    )
    precision = PrecisionDiffers("bfloat16", "float32", (ArgumentDiffers("bf16", True, False),))
    assert (
        contract_evidence_text(precision)
        == "bf16 autocast on vs off: the forward computes in bfloat16 vs float32"
    )


def test_a_plan_difference_holds_typed_values_not_any() -> None:
    """The values a plan, adapter or framework argument differs in are typed: a plan's value
    (``PlanValue``) or a recorded JSON value (``JsonValue``), never ``Any``."""
    held = {
        cls.__name__: typing.get_args(cls.__orig_bases__[0])  # type: ignore[attr-defined]
        for cls in (SettingDiffers, ArgumentDiffers)
    }
    assert held == {
        "SettingDiffers": (typing.ForwardRef(contract_evidence.PlanValue),),
        "ArgumentDiffers": (typing.ForwardRef(contract_evidence.JsonValue),),
    }
    assert (AdapterDiffers.__annotations__["a"], AdapterDiffers.__annotations__["b"]) == (
        "PlanValue",
        "PlanValue",
    )
    said = contract_evidence_text(SettingDiffers("betas", (0.9, 0.999), (0.9, 0.95)))
    assert said == "betas: [0.9, 0.999] vs [0.9, 0.95]"
