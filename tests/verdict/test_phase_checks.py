"""What a phase was checked against instead of alignment is a fact (``verdict.phase_checks``):
the case's ``expect:`` met or not with the first divergence found, the run's expected divergence
judging the case, a phase downstream of the expected one, a phase judged by the run's scalars.
The words are made when rendered (``reports.expectation_text``), as the terminal and report.json
said them before, and verdict/ hands no such check a sentence."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from pytest_precalign.compare.op_pairing import settle_op_pairs
from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.reports.document import phase_dict
from pytest_precalign.reports.expectation_text import expectation_text
from pytest_precalign.reports.text import PhaseReport, failure_message, summary_line
from pytest_precalign.specs.expectation import Expectation
from pytest_precalign.trace.records import Record, Trace
from pytest_precalign.verdict.phase import PhaseVerdict, phase_verdict
from pytest_precalign.verdict.phase_checks import ExpectationChecked, NotGated, PhaseCheck
from pytest_precalign.verdict.training_traces import judged_by_scalars

from .test_rules import two_layers
from .test_run_facts import VERDICT, _is_words

WHERE = "align.yaml cases[0].expect"


def _checked(
    expect: Expectation | None, base: list[Record], cand: list[Record], earlier: bool = False
) -> PhaseVerdict:
    manifest = {"record_mode": "stats", "record_level": "module"}
    baseline, candidate = Trace(manifest, tuple(base)), Trace(manifest, tuple(cand))
    comparison = settle_op_pairs(compare_traces(baseline, candidate, default_table()), baseline, candidate)
    return phase_verdict(comparison, "forward", expect, earlier)


def _expect(name: str, origin: bool | None = True) -> Expectation:
    return Expectation("forward", name, origin, "activation", WHERE)


def test_the_verdict_holds_what_it_was_checked_against() -> None:
    assert typing.get_type_hints(PhaseVerdict)["expectation"] == PhaseCheck | None
    same, diverged = two_layers(1.0, 1.0, 2.0), two_layers(1.0, 1.0, 3.0)  # b diverges, its inputs matched
    met = _checked(_expect("b"), same, diverged)
    assert met.passed and met.expectation == ExpectationChecked(_expect("b"), True, ("b", True, "activation"))
    missed = _checked(_expect("a", None), same, diverged)
    assert not missed.passed
    assert missed.expectation == ExpectationChecked(_expect("a", None), False, ("b", True, "activation"))
    aligned = _checked(_expect("b"), same, same)
    assert not aligned.passed and aligned.expectation == ExpectationChecked(_expect("b"), False, None)
    assert _checked(None, same, diverged, earlier=True).expectation == NotGated("downstream", "forward")
    assert judged_by_scalars(aligned, "backward").expectation == NotGated("by_scalars", "backward")


def test_each_check_is_said_as_before() -> None:
    said = [
        expectation_text(ExpectationChecked(_expect("b"), True, ("b", True, "activation"))),
        expectation_text(ExpectationChecked(_expect("a", None), False, ("b", False, "activation"))),
        expectation_text(ExpectationChecked(_expect("b", False), False, None)),
        expectation_text(NotGated("by_run", "forward")),
        expectation_text(NotGated("downstream", "forward")),
        expectation_text(NotGated("by_scalars", "step")),
    ]
    assert said == [
        "found the expected first divergence 'b' (origin: true) of kind activation",
        f"expected first divergence 'a' of kind activation ({WHERE}), found 'b' (origin: false, kind activation)",
        f"expected first divergence 'b' (origin: false) of kind activation ({WHERE}), but the phase is aligned",
        "judged by the run's expected divergence (records not gated)",
        "downstream of the expected divergence (not gated)",
        "no step records on either side: judged by the run's per-step scalars",
    ]


def test_the_terminal_and_report_json_say_the_check_as_before() -> None:
    missed = _checked(_expect("a", None), two_layers(1.0, 1.0, 2.0), two_layers(1.0, 1.0, 3.0))
    report = PhaseReport("align.yaml", "c1", "forward", missed, "b", "c", "t", "again")
    words = f"expected first divergence 'a' of kind activation ({WHERE}), found 'b' (origin: true, kind activation)"
    assert f"Known divergence not reproduced: {words}" in failure_message(report).splitlines()
    assert f"; {words}" in summary_line(report)
    assert phase_dict(report)["expectation"] == words


def test_no_phase_check_is_said_in_verdict() -> None:
    """No string with a space is handed to ``expectation=`` or made by the function that checks
    an expectation (``_meets``, ``_gate``) in verdict/."""
    made = []
    for path in sorted(Path(VERDICT).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            given: list[ast.expr] = []
            if isinstance(node, ast.Call):
                given = [k.value for k in node.keywords if k.arg == "expectation"]
            elif isinstance(node, ast.FunctionDef) and node.name in ("_meets", "_gate"):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                given = [
                    e for stmt in body for e in ast.walk(stmt) if isinstance(e, ast.JoinedStr | ast.Constant)
                ]
            made += [f"{path.name}:{e.lineno}" for e in given if _is_words(e)]
    assert made == []
