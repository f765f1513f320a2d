"""What fails a phase for want of evidence is a fact: nothing compared (no record recorded, none
paired, none comparable), too little compared, a step one side only recorded, parameter grads
gone (``verdict.coverage.CoverageProblem``, with the hint why the sides may not pair); the
coverage holds the numbers, and the words are made when rendered (``reports.coverage_text``), as
the terminal, the JUnit properties and report.json said them before. No module of verdict/
hands these facts a sentence."""

from __future__ import annotations

import ast
import typing
from dataclasses import replace
from pathlib import Path

from pytest_precalign.reports.coverage_text import coverage_problem_text, coverage_text
from pytest_precalign.reports.document import junit_properties, phase_dict
from pytest_precalign.reports.text import PhaseReport, failure_message, summary_line
from pytest_precalign.trace.note_blocks import MissingGrads
from pytest_precalign.verdict.coverage import (
    Coverage,
    CoverageProblem,
    GradsMissing,
    NothingComparable,
    NothingPaired,
    PairingHint,
    TooLittle,
)
from pytest_precalign.verdict.phase_notes import with_missing_grads
from pytest_precalign.verdict.run_findings import StepsOneSided

from .test_rules import rec, verdict
from .test_run_facts import VERDICT, _is_words

_GONE = MissingGrads(step=1, rank=0, count=4, names=("w", "b"), why="zeroed before stop()")


def _cov(problem: CoverageProblem | None, **numbers: typing.Any) -> Coverage:
    fields = {"phase": "forward", "outputs": 4, "paired": 0, "only_baseline": 4, "only_candidate": 0}
    fields |= {"unexplained_baseline": 4, "unexplained_candidate": 0, "floor": 0.5}
    return Coverage(**(fields | numbers), problem=problem)


def test_the_coverage_holds_its_problem_typed() -> None:
    assert typing.get_type_hints(Coverage)["problem"] == CoverageProblem | None
    api_calls = [rec(i, "Functional.linear", "activation", 1.0, module_class="api", call=i) for i in range(2)]
    v = verdict([rec(0, "x", "input", 1.0), *api_calls], [rec(0, "x", "input", 1.0)])
    assert v.coverage is not None and not v.coverage.ok
    assert v.coverage.problem == NothingPaired(PairingHint("candidate_none", "APIs", ""))


def test_grads_gone_are_held_as_the_notes_and_fail_the_backward() -> None:
    grads = [rec(0, "a", "param_grad", 1.0), rec(1, "b", "param_grad", 2.0)]
    aligned = verdict(grads, grads, phase="backward")
    assert aligned.passed
    v = with_missing_grads(aligned, {"baseline": [], "candidate": [_GONE]})
    assert not v.passed and v.coverage is not None
    assert v.coverage.problem == GradsMissing((("candidate", _GONE),))
    assert with_missing_grads(aligned, {"baseline": []}) is aligned


def test_each_problem_is_said_as_before() -> None:
    said = {
        "step": coverage_problem_text(_cov(StepsOneSided("candidate", (2, 3)), paired=2)),
        "comparable": coverage_problem_text(_cov(NothingComparable(), uncompared=4, uncompared_why="a vs b")),
        "none": coverage_problem_text(_cov(NothingPaired(), outputs=0, only_candidate=3)),
        "api": coverage_problem_text(_cov(NothingPaired(PairingHint("candidate_none", "APIs")))),
        "little": coverage_problem_text(
            _cov(TooLittle(PairingHint("names_differ")), paired=1, uncompared=1, uncompared_why="a vs b")
        ),
        "grads": coverage_problem_text(_cov(GradsMissing((("baseline", _GONE), ("candidate", _GONE))))),
    }
    assert said == {
        "step": "a step missing: steps 2, 3 were recorded by the candidate only (the other side has no forward "
        "record of them)",
        "comparable": "nothing compared: 4 of 4 baseline forward output records have evidence that cannot be "
        "compared (a vs b)",
        "none": "nothing compared: the baseline recorded no forward output record (3 candidate-only)",
        "api": "nothing compared: all 4 baseline forward output records found no partner; the candidate "
        "recorded none of them, all API calls: a mix or L1 dump against an L0 one? (record both at the same "
        "level)",
        "little": "too little compared: 1 of 4 baseline forward output records paired (25%, under the floor of "
        "50%); 4 found no partner; the names differ between the sides (a mapping rule missing or not "
        "applied?); 1 cannot be compared (a vs b) (min_coverage sets the floor)",
        "grads": "param grads missing: the baseline recorded no parameter grad at step 1 (rank 0; 4 parameters, "
        "e.g. w, b): zeroed before stop(); the candidate recorded no parameter grad at step 1 (rank 0; 4 "
        "parameters, e.g. w, b): zeroed before stop()",
    }
    assert coverage_problem_text(_cov(None)) == ""
    assert coverage_text(_cov(None, paired=3, outputs=1000, merged=2, uncompared=1, uncompared_why="x")) == (
        "coverage <1% (3 of 1000 baseline forward output records paired; floor 50%); 2 by merged statistics; "
        "1 not compared (x)"
    )


def test_the_terminal_junit_and_report_json_say_the_problem_as_before() -> None:
    v = verdict([rec(0, "a", "input", 1.0), rec(1, "a", "activation", 1.0)], [rec(0, "a", "input", 1.0)])
    v = replace(v, coverage=replace(v.coverage, problem=GradsMissing((("candidate", _GONE),))))
    report = PhaseReport("align.yaml", "c1", "forward", v, "b", "c", "t", "again")
    words = "the candidate recorded no parameter grad at step 1 (rank 0; 4 parameters, e.g. w, b): zeroed before stop()"
    assert f"Param grads missing in forward: {words}" in failure_message(report).splitlines()
    assert f"1 unmatched; param grads missing: {words}; coverage 0% (1 unexplained)" in summary_line(report)
    assert ("precalign_coverage_problem", f"param grads missing: {words}") in junit_properties(v)
    assert phase_dict(report)["coverage"]["problem"] == f"param grads missing: {words}"


# The calls that make a coverage problem's fact, the field that holds one, and the functions that
# gather them: none is handed or builds a sentence in verdict/.
_PROBLEM_MADE_BY = {
    "StepsOneSided",
    "NothingComparable",
    "NothingRecorded",
    "NothingPaired",
    "TooLittle",
    "GradsMissing",
    "PairingHint",
}
_GATHERERS = {
    "Coverage",
    "measure_coverage",
    "_one_sided_step",
    "_problem",
    "_hint",
    "_level",
    "with_missing_grads",
}


def problem_sentences_in_verdict(folder: Path) -> list[str]:
    """Where a module of ``folder`` hands a coverage problem a sentence: a string given to a call
    that makes one or to ``replace``'s ``problem``, or any f-string built by a function that
    gathers them (or in the class ``Coverage``)."""
    made = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            given: list[ast.expr] = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"replace", "Coverage"}:
                given = [k.value for k in node.keywords if k.arg == "problem"]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in _PROBLEM_MADE_BY:
                given = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in _GATHERERS:
                given = [e for e in ast.walk(node) if isinstance(e, ast.JoinedStr)]
            made += [f"{path.name}:{e.lineno}" for e in given if _is_words(e)]
    return sorted(set(made))


def test_no_coverage_problem_is_said_in_verdict() -> None:
    """verdict/ holds the problem and the numbers; reports/ says them."""
    assert problem_sentences_in_verdict(VERDICT) == []
