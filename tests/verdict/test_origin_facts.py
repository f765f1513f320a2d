"""A phase's origin claim is a fact (``verdict.origin_facts``); its words are made when rendered
(``reports.origin_text``, ``training_evidence_text.proof_text``): each fact holds the records,
modules, slots and sizes its sentence states, the renderer says the sentence the verdict said
before, and no module of verdict/ hands an origin fact a sentence."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from pytest_precalign.reports.text import origin_headline
from pytest_precalign.reports.training_evidence_text import case_origin_text, proof_text
from pytest_precalign.trace.records import Record
from pytest_precalign.verdict import origin_facts as facts
from pytest_precalign.verdict.origin_facts import OriginProof
from pytest_precalign.verdict.run_evidence import ScalarsDiffer
from pytest_precalign.verdict.scalar_evidence import BatchDiffers
from pytest_precalign.verdict.story import origin_of
from pytest_precalign.verdict.training_scalars import ScalarDiff

from .test_rules import first_of, rec, rid, verdict
from .test_run_facts import VERDICT, _is_words

_NOT_AMPLIFIED = "its change not amplified over theirs"
_SAID: list[tuple[OriginProof, str]] = [
    (facts.Matched("inputs"), "its inputs matched, its output did not"),
    (facts.Matched("grad"), "its grad matched, the optimizer step made it differ"),
    (
        facts.UpdateCheck("the candidate's optimizer step is not adamw(...)"),
        "the candidate's optimizer step is not adamw(...)",
    ),
    (
        facts.BetweenChildren("blk", "o_proj", "input", ("a", "b", "c", "d", "e", "f", "g")),
        "its inputs and children a, b, c, d, e, f, ... matched, o_proj's input did not: the divergence "
        "enters in its own code",
    ),
    (
        facts.BetweenChildren("blk", "n", "output_grad", ()),
        "its inputs matched, n's grad w.r.t. its output did not: the divergence enters in its own code",
    ),
    (facts.NoMatchedModule(walked=False), "no enclosing module with matching inputs was recorded"),
    (
        facts.NoMatchedModule(walked=True),
        "origin unproven: no enclosing module's inputs were compared and matched",
    ),
    (
        facts.NoPartner(("blk.n|grad_output|out|0|0",)),
        "origin unproven: input blk.n grad_output has no partner",
    ),
    (
        facts.NoPartner(("attn.rotary|input|in.1|0|0", "a", "b")),
        "origin unproven: input attn.rotary input in.1 has no partner (and 2 more)",
    ),
    (
        facts.InputsWithinTolerance("b|input|in.0|0|0", 5e-7, 1.0),
        "its inputs differed within tolerance (up to 5.000e-07 relative, b input in.0), its output by 1.000e+00 "
        "(amplified)",
    ),
    (
        facts.InputsWithinTolerance("b|input|in.0|0|0", 5e-7, 1e-7),
        "its inputs differed within tolerance (up to 5.000e-07 relative, b input in.0), its output by 1.000e-07 "
        "(not amplified: the inputs' difference may explain it)",
    ),
    (
        facts.InputsWithinTolerance("b|input|in.0|0|0", 5e-7, None),
        "its inputs differed within tolerance (up to 5.000e-07 relative, b input in.0), its output failed",
    ),
    (
        facts.SteeringInputs(("attention_mask", "position_ids")),
        "its data inputs matched, its attention_mask, position_ids did not (not data: it steers the computation, "
        "same shape and dtype on both sides, other values): the divergence enters through it",
    ),
    (
        facts.MovedOutput(1e-6, "b|activation|out|0|0"),
        "the first output of the step to differ at all (by 1.000e-06 relative, within tolerance): every record "
        "before it and its inputs were identical on both sides; b activation failed downstream of it, its inputs "
        f"within tolerance, {_NOT_AMPLIFIED}",
    ),
    (
        facts.MovedInput("m.layers.0|input|in.0|0|0", None, "m", "m.head|activation|out|0|0"),
        "the first record of the step to differ at all is m.layers.0 input in.0 (within tolerance): every record "
        "before it was identical on both sides, m's inputs too, so m's own code made it between its recorded "
        "children; m.head activation failed downstream of it, its inputs within tolerance, "
        f"{_NOT_AMPLIFIED}",
    ),
    (
        facts.OneSideBefore(
            None,
            (
                facts.OneSided("Functional.silu", 1, "forward", "baseline"),
                facts.OneSided("Functional.gelu", 0, "forward", "candidate"),
            ),
        ),
        "origin unproven: no enclosing module whose inputs matched was recorded; only one side made just before "
        "it: Functional.silu.1.forward (baseline only) / Functional.gelu.0.forward (candidate only)",
    ),
    (
        facts.OneSideBefore(
            facts.NoPartner(("x|input|in.0|0|0",)), (facts.OneSided("Torch.add", 3, "backward", "candidate"),)
        ),
        "origin unproven: input x input in.0 has no partner; only one side made just before it: "
        "Torch.add.3.backward (candidate only)",
    ),
    (
        facts.OtherData(2, True, ScalarsDiffer(ScalarDiff("data", "batch", BatchDiffers(2, "aa", "bb")))),
        "origin unproven: downstream of step 2's data: the batch of step 2 differs (sha256 aa vs bb); the step's "
        "inputs were other data (the run verdict says data)",
    ),
]


@pytest.mark.parametrize(("fact", "said"), _SAID, ids=[type(f).__name__ for f, _ in _SAID])
def test_each_origin_fact_says_what_the_verdict_said(fact: OriginProof, said: str) -> None:
    assert proof_text(fact) == said


def test_every_kind_of_claim_has_its_words() -> None:
    kinds = {typing.get_origin(kind) or kind for kind in typing.get_args(OriginProof)}
    assert {type(fact) for fact, _ in _SAID} == kinds


def test_the_case_origin_holds_its_role_and_set_aside_slots_and_says_them() -> None:
    first = first_of(verdict(_children(1.0), _children(2.0)))
    origin = origin_of(first, ("q_proj", "k_proj"))
    assert origin.evidence == facts.BetweenChildren("attn", "o_proj", "input", ("q_proj", "k_proj"))
    assert (origin.module, origin.role, origin.proven) == ("attn", "matched_inputs", True)
    aside = dataclasses.replace(origin, aside=("attention_mask",))
    assert case_origin_text(aside) == (
        "its inputs and children q_proj, k_proj matched, o_proj's input did not: the divergence enters in its "
        "own code; set aside (not data; their shape, dtype or presence changed between the sides): attention_mask"
    )
    assert aside.as_dict(case_origin_text(aside))["evidence"] == case_origin_text(aside)
    unproven = facts.CaseOrigin(
        "blk.n", "backward", "param_grad", 0, "blk.n", facts.NoPartner(("blk.n|input|in.0|0|0",)), False
    )
    unproven = dataclasses.replace(unproven, role="first_paired")
    v = dataclasses.replace(verdict(_children(1.0), _children(2.0)), case_origin=unproven)
    assert origin_headline(v) == [
        "Origin unproven (backward, step 0): input blk.n input in.0 has no partner; first divergent paired "
        "module: blk.n"
    ]


def _children(o_in: float) -> list[Record]:
    """attn > attn.q_proj, attn.k_proj, attn.o_proj: attn's inputs and q/k match, what o_proj
    receives (made by attn's code between its children) differs."""
    return [
        rec(0, "attn", "input", 1.0),
        rec(1, "attn.q_proj", "input", 1.0),
        rec(2, "attn.q_proj", "activation", 1.0, deps=(rid("attn.q_proj", "input"),)),
        rec(3, "attn.k_proj", "input", 1.0),
        rec(4, "attn.k_proj", "activation", 1.0, deps=(rid("attn.k_proj", "input"),)),
        rec(5, "attn.o_proj", "input", o_in),
        rec(6, "attn.o_proj", "activation", o_in, deps=(rid("attn.o_proj", "input"),)),
        rec(7, "attn", "activation", o_in, deps=(rid("attn", "input"),)),
    ]


# The calls that make an origin fact (every dataclass of ``origin_facts``) or a first divergence,
# and the fields and names that hold one.
_ORIGIN_MADE_BY = {n for n, o in vars(facts).items() if dataclasses.is_dataclass(o)} | {"Divergence"}
_ORIGIN_FIELDS = {"proof", "evidence", "role", "unproven"}
_NO_WORDS = {"story.py", "evidence.py", "origin_facts.py"}  # no function of these returns a sentence
_WALKS = {"_origin", "_after_unmatched", "_between_children", "moved_origin"}  # nor these


def origin_sentences_in_verdict(folder: Path) -> list[str]:
    """Where a module of ``folder`` hands an origin claim a sentence: a string given to a call
    that makes an origin fact or a first divergence, to ``replace``'s proof, evidence or role,
    assigned to a name of those, or returned by the modules and walks that make the claim."""
    made = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            given: list[ast.expr] = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "replace":
                given = [k.value for k in node.keywords if k.arg in _ORIGIN_FIELDS]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in _ORIGIN_MADE_BY:
                given = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                given = _assigned(node.targets if isinstance(node, ast.Assign) else [node.target], node.value)
            elif isinstance(node, ast.FunctionDef) and (path.name in _NO_WORDS or node.name in _WALKS):
                given = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
                given = [e for v in given for e in (v.elts if isinstance(v, ast.Tuple) else [v])]
            made += [f"{path.name}:{e.lineno}" for e in given if _is_words(e) or _joined_words(e)]
    return sorted(set(made))


def _assigned(targets: list[ast.expr], value: ast.expr) -> list[ast.expr]:
    """The values assigned to a name of ``_ORIGIN_FIELDS`` (tuple targets paired)."""
    out = []
    for target in targets:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            out += [
                v
                for t, v in zip(target.elts, value.elts, strict=False)
                if getattr(t, "id", None) in _ORIGIN_FIELDS
            ]
        elif getattr(target, "id", None) in _ORIGIN_FIELDS:
            out.append(value)
    return out


def _joined_words(expr: ast.expr) -> bool:
    """A sentence inside ``a or "words"`` or ``"words" + b``."""
    if isinstance(expr, ast.BoolOp):
        return any(_is_words(v) or _joined_words(v) for v in expr.values)
    if isinstance(expr, ast.BinOp):
        return any(_is_words(v) or _joined_words(v) for v in (expr.left, expr.right))
    return False


def test_no_origin_claim_is_said_in_verdict() -> None:
    """verdict/ makes origin facts; reports/ says them."""
    assert origin_sentences_in_verdict(VERDICT) == []
