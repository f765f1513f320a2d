"""What a phase's origin claim rests on, in words (the verdict holds the facts:
``verdict.origin_facts``): the first divergence's proof and the case origin's evidence, as the
terminal, report.json and the HTML say them. The data story's claim (``OtherData``) names the
run verdict's evidence: its words are made by ``training_evidence_text.proof_text``, which tells
the rest here."""

from __future__ import annotations

from collections.abc import Sequence

from ..verdict.origin_facts import (
    ApiCallEarlier,
    BetweenChildren,
    InputsWithinTolerance,
    LowerPrecisionFirst,
    Matched,
    ModuleProof,
    MovedInput,
    MovedOutput,
    NoMatchedModule,
    NoPartner,
    OneSideBefore,
    OriginRole,
    RecordChoice,
    SteeringInputs,
    UpdateCheck,
)

ROLE_TEXT: dict[OriginRole, str] = {
    "matched_inputs": "innermost module whose inputs all matched",
    "first_paired": "first divergent paired module",
}
_DOWNSTREAM = "its inputs within tolerance, its change not amplified over theirs"


def shown_id(record_id: str) -> str:
    """``blocks.1.norm input in.0`` for the id ``blocks.1.norm|input|in.0|0|0``."""
    name, kind, slot, *_ = [*record_id.split("|"), "", ""]
    return " ".join(part for part in (name, kind, slot) if part and part != "out")


def module_proof_text(proof: ModuleProof) -> str:
    """The claim in words (every kind but the data story's)."""
    match proof:
        case Matched(what):
            if what == "grad":
                return "its grad matched, the optimizer step made it differ"
            return "its inputs matched, its output did not"
        case UpdateCheck(note):
            return note  # the compare layer's words
        case NoMatchedModule(walked):
            if walked:
                return "origin unproven: no enclosing module's inputs were compared and matched"
            return "no enclosing module with matching inputs was recorded"
        case NoPartner(inputs):
            extra = f" (and {len(inputs) - 1} more)" if len(inputs) > 1 else ""
            return f"origin unproven: input {shown_id(inputs[0])} has no partner{extra}"
        case SteeringInputs(slots):
            return (
                f"its data inputs matched, its {', '.join(slots)} did not (not data: it steers the computation, "
                "same shape and dtype on both sides, other values): the divergence enters through it"
            )
        case OneSideBefore(prior, sides):
            told = module_proof_text(prior) if prior else _NO_MATCHED_MODULE
            made = " / ".join(f"{s.name}.{s.call}.{s.direction} ({s.side} only)" for s in sides)
            return f"{told}; only one side made just before it: {made}"
    return _measured_text(proof)


_NO_MATCHED_MODULE = "origin unproven: no enclosing module whose inputs matched was recorded"


def _measured_text(proof: ModuleProof) -> str:
    """The claims that state sizes and children."""
    match proof:
        case BetweenChildren(module, child, what, children):
            shown = ", ".join(children[:6]) + (", ..." if len(children) > 6 else "")
            matched = f" and children {shown}" if shown else ""
            received = "input" if what == "input" else "grad w.r.t. its output"
            return f"its inputs{matched} matched, {child}'s {received} did not: the divergence enters in its own code"
        case InputsWithinTolerance(input_id, size, own):
            head = f"its inputs differed within tolerance (up to {size:.3e} relative, {shown_id(input_id)})"
            if own is None:
                return head + ", its output failed"
            verdict = "amplified" if own > size else "not amplified: the inputs' difference may explain it"
            return head + f", its output by {own:.3e} ({verdict})"
        case MovedOutput(size, failing):
            return (
                f"the first output of the step to differ at all{_by(size)}: every record before it and its inputs "
                f"were identical on both sides; {shown_id(failing)} failed downstream of it, {_DOWNSTREAM}"
            )
    assert isinstance(proof, MovedInput)
    module = proof.module
    return (
        f"the first record of the step to differ at all is {shown_id(proof.start)}{_by(proof.size)}: every "
        f"record before it was identical on both sides, {module}'s inputs too, so {module}'s own code "
        f"made it between its recorded children; {shown_id(proof.failing)} failed downstream of it, {_DOWNSTREAM}"
    )


def _by(size: float | None) -> str:
    return f" (by {size:.3e} relative, within tolerance)" if size else " (within tolerance)"


def aside_text(slots: Sequence[str]) -> str:
    """``set aside (not data; ...): attention_mask``, or nothing without slots."""
    if not slots:
        return ""
    return "set aside (not data; their shape, dtype or presence changed between the sides): " + ", ".join(
        slots
    )


def choice_text(why: RecordChoice | None) -> str:
    """How the first divergence's record was chosen, in words ("" when it is simply the first
    failing one)."""
    if why is None:
        return ""
    if isinstance(why, ApiCallEarlier):
        return f"the API call {why.op} diverged earlier, outside it"
    assert isinstance(why, LowerPrecisionFirst)
    return (
        f"dtype {why.candidate} (candidate) vs {why.baseline} (baseline): within the {why.tolerance} "
        f"tolerance, but {why.failing} fails after it under the {why.failing_dtype} tolerance"
    )
