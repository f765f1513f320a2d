"""An overflow of the candidate's module outputs holds what was seen as a fact (``made``,
``passed_on``, ``masked``, ``blown_up``); the words are made when rendered
(``reports.overflow_text``), as the terminal and report.json said them before, and
verdict/overflow.py hands no overflow a sentence."""

from __future__ import annotations

import ast
import typing

from pytest_precalign.reports.document import phase_dict
from pytest_precalign.reports.overflow_text import overflow_why
from pytest_precalign.reports.text import PhaseReport, failure_message
from pytest_precalign.trace.records import Record
from pytest_precalign.verdict.overflow import Overflow, OverflowLevel, OverflowSeen, overflow_levels

from .test_rules import rec, rid, verdict
from .test_run_facts import VERDICT, _is_words


def _records() -> list[Record]:
    return [
        rec(0, "a", "input", 1.0, nan=1),
        rec(1, "a", "activation", 1.0, deps=(rid("a", "input"),)),  # masked
        rec(2, "b", "input", 1.0),
        rec(3, "b", "activation", 1.0, nan=2, deps=(rid("b", "input"),)),  # made
        rec(4, "c", "input", 1.0, inf=1),
        rec(5, "c", "activation", 1.0, inf=1, deps=(rid("c", "input"),)),  # passed on
        rec(6, "d", "input", 1.0),
        rec(7, "d", "activation", 6e5, deps=(rid("d", "input"),)),  # blown up: norm 1.2e6
    ]


def test_an_overflow_holds_what_was_seen() -> None:
    hints = typing.get_type_hints(Overflow)
    assert (hints["level"], hints["seen"]) == (OverflowLevel, OverflowSeen)
    records = _records()
    found = overflow_levels(records, {r.id: r for r in records})
    assert [(o.record.name, o.level, o.seen) for o in found] == [
        ("a", "medium", "masked"),
        ("b", "critical", "made"),
        ("c", "high", "passed_on"),
        ("d", "high", "blown_up"),
    ]


def test_overflows_are_said_as_before() -> None:
    records = _records()
    found = overflow_levels(records, {r.id: r for r in records})
    assert [overflow_why(o) for o in found] == [
        "a non-finite input, finite output",
        "finite inputs, non-finite output",
        "inputs and output non-finite",
        "output norm 1.2e+06 > 10000 x input norm",
    ]
    base = [rec(2, "b", "input", 1.0), rec(3, "b", "activation", 1.0, deps=(rid("b", "input"),))]
    cand = [r for r in _records() if r.name == "b"]
    report = PhaseReport("align.yaml", "c1", "forward", verdict(base, cand), "b", "c", "t", "again")
    lines = failure_message(report).splitlines()
    assert lines[lines.index("Overflow in the candidate (1 module outputs):") + 1] == (
        "  critical b (finite inputs, non-finite output)"
    )
    assert phase_dict(report)["overflow"] == [
        {"name": "b", "call": 0, "level": "critical", "why": "finite inputs, non-finite output"}
    ]


def test_no_overflow_is_said_in_verdict() -> None:
    """verdict/overflow.py builds no sentence: what was seen is a word of ``OverflowSeen``."""
    tree = ast.parse((VERDICT / "overflow.py").read_text())
    made = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.JoinedStr | ast.Constant) and _is_words(n)]
    docstrings = {n.body[0].lineno for n in ast.walk(tree) if isinstance(n, ast.Module | ast.FunctionDef)}
    assert [line for line in made if line not in docstrings] == []
