"""A phase verdict's run notes and the first divergence's record choice are facts: the verdict
holds the merge's replica notes, a partial step with the steps compared, and why the record was
chosen (``origin_facts.RecordChoice``); the words are made when rendered
(``reports.phase_notes_text``, ``origin_text.choice_text``), as the terminal and report.json
said them before, and no module of verdict/ hands these facts a sentence."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from pytest_precalign.reports.document import phase_dict
from pytest_precalign.reports.origin_text import choice_text
from pytest_precalign.reports.phase_notes_text import partial_step_text, replica_mismatch_text
from pytest_precalign.reports.text import PhaseReport, failure_message, summary_line
from pytest_precalign.trace.note_blocks import IncompleteStep, ReplicaMismatch
from pytest_precalign.verdict.origin_facts import ApiCallEarlier, LowerPrecisionFirst, RecordChoice
from pytest_precalign.verdict.phase import Divergence, PartialStep, PhaseVerdict
from pytest_precalign.verdict.phase_notes import with_incomplete_steps, with_replica_mismatches

from .test_rules import two_layers, verdict
from .test_run_facts import VERDICT, _is_words

_NORM = ReplicaMismatch(
    "norm.weight|param|out|0|0",
    "norm.weight",
    "param",
    "forward",
    0,
    "rank0",
    ("rank1", "rank3"),
    "max 1 vs 1.5",
)
_GRAD = ReplicaMismatch(
    "norm.weight|param_grad|out|0|0", "norm.weight", "param_grad", "backward", 0, "rank0", ("rank1",), "x"
)
_CUT = IncompleteStep(2, "/runs/killed: step2/ is incomplete")
_CUT_TOO = IncompleteStep(3, "/runs/other: step3/ is incomplete")


def _aligned() -> PhaseVerdict:
    aligned = verdict(two_layers(1.0, 1.0, 2.0), two_layers(1.0, 1.0, 2.0))
    assert aligned.passed
    return aligned


def _noted() -> PhaseVerdict:
    noted = with_replica_mismatches(_aligned(), [_NORM, _GRAD])
    return with_incomplete_steps(noted, [PartialStep(_CUT, (0, 1)), PartialStep(_CUT_TOO, (0, 1, 2))])


def test_the_verdict_holds_the_notes_and_the_choice_typed() -> None:
    hints = typing.get_type_hints(PhaseVerdict)
    assert hints["replica_mismatches"] == tuple[ReplicaMismatch, ...]
    assert hints["incomplete_steps"] == tuple[PartialStep, ...]
    assert typing.get_type_hints(Divergence)["why"] == RecordChoice | None


def test_the_phase_holds_its_own_replica_notes_and_the_partial_steps() -> None:
    noted = _noted()
    assert not noted.passed
    assert noted.replica_mismatches == (_NORM,)  # the backward's note is the backward's
    assert noted.incomplete_steps == (PartialStep(_CUT, (0, 1)), PartialStep(_CUT_TOO, (0, 1, 2)))
    aligned = _aligned()  # no note of its own: the phase is left as judged
    assert with_incomplete_steps(with_replica_mismatches(aligned, [_GRAD]), []) is aligned


def test_the_notes_and_the_choice_are_said_as_before() -> None:
    assert replica_mismatch_text(_NORM) == (
        "norm.weight (param, step 0): rank1, rank3 recorded other values than rank0 (max 1 vs 1.5)"
    )
    assert partial_step_text(PartialStep(_CUT, (0, 1))) == (
        "/runs/killed: step2/ is incomplete: step 2 not compared (steps 0, 1 compared)"
    )
    assert choice_text(None) == ""
    assert choice_text(ApiCallEarlier("Functional.softmax.0.forward in attn")) == (
        "the API call Functional.softmax.0.forward in attn diverged earlier, outside it"
    )
    assert choice_text(LowerPrecisionFirst("bfloat16", "float32", "bfloat16", "b", "float32")) == (
        "dtype bfloat16 (candidate) vs float32 (baseline): within the bfloat16 tolerance, but b fails "
        "after it under the float32 tolerance"
    )


def test_the_terminal_and_report_json_say_the_notes_as_before() -> None:
    report = PhaseReport("align.yaml", "c1", "forward", _noted(), "b", "c", "t", "again")
    lines = failure_message(report).splitlines()
    told = lines.index(
        "Ranks disagree on replicated tensors (the first rank's copy was compared; "
        "a sharding rule is missing or one rank diverged):"
    )
    assert lines[told + 1] == (
        "  norm.weight (param, step 0): rank1, rank3 recorded other values than rank0 (max 1 vs 1.5)"
    )
    assert lines[told + 2 : told + 5] == [
        "Steps not compared (a run interrupted mid-step; the phase fails):",
        "  /runs/killed: step2/ is incomplete: step 2 not compared (steps 0, 1 compared)",
        "  /runs/other: step3/ is incomplete: step 3 not compared (steps 0, 1, 2 compared)",
    ]
    assert (
        "; ranks disagree on 1 replicated record(s); /runs/killed: step2/ is incomplete: step 2 not compared "
        "(steps 0, 1 compared) (and 1 more)"
    ) in summary_line(report)
    assert phase_dict(report)["incomplete_steps"] == [
        "/runs/killed: step2/ is incomplete: step 2 not compared (steps 0, 1 compared)",
        "/runs/other: step3/ is incomplete: step 3 not compared (steps 0, 1, 2 compared)",
    ]


# The calls that make a phase note's fact, the fields that hold one, and the functions that
# gather them: none is handed or builds a sentence in verdict/.
_NOTE_MADE_BY = {"PartialStep", "ReplicaMismatch", "LowerPrecisionFirst", "ApiCallEarlier"}
_NOTE_FIELDS = {"replica_mismatches", "incomplete_steps", "why"}
_GATHERERS = {
    "with_replica_mismatches",
    "with_incomplete_steps",
    "_incomplete_steps",
    "divergent_pair",
    "find_first",
}


def note_sentences_in_verdict(folder: Path) -> list[str]:
    """Where a module of ``folder`` hands a phase note or a record choice a sentence: a string
    given to a call that makes one or to ``replace``'s note fields, or any f-string built by a
    function that gathers them."""
    made = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            given: list[ast.expr] = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "replace":
                given = [k.value for k in node.keywords if k.arg in _NOTE_FIELDS]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in _NOTE_MADE_BY:
                given = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.FunctionDef) and node.name in _GATHERERS:
                given = [e for e in ast.walk(node) if isinstance(e, ast.JoinedStr)]
            made += [f"{path.name}:{e.lineno}" for e in given if _is_words(e)]
    return sorted(set(made))


def test_no_phase_note_or_record_choice_is_said_in_verdict() -> None:
    """verdict/ holds the notes and the choice; reports/ says them."""
    assert note_sentences_in_verdict(VERDICT) == []
