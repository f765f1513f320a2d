"""Origin only with evidence, and one story per case (verdict/evidence.py, verdict/story.py),
on records written as data as in test_rules.py: an input without a partner proves nothing, an
input that passed while it differed is named with its size, and a case has one origin."""

from __future__ import annotations

from dataclasses import replace

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.reports.text import PhaseReport, failure_message
from pytest_precalign.reports.training_evidence_text import case_origin_text, proof_text
from pytest_precalign.trace.records import Record, Trace
from pytest_precalign.verdict.origin_facts import (
    InputsWithinTolerance,
    MovedOutput,
    NoPartner,
    SteeringInputs,
)
from pytest_precalign.verdict.phase import PhaseVerdict
from pytest_precalign.verdict.story import tell_case

from .test_rules import first_of, rec, rid, two_layers, verdict


def _norm_grads(candidate: bool, weight_grad: float) -> list[Record]:
    """blk.n inside blk; on the candidate, blk.n's grad_output was never recorded (as with a
    one-sided reentrant recompute); blk.n.weight's grad is made from it and blk.n's input."""
    records = [
        rec(0, "blk.n", "input", 1.0),
        rec(1, "blk.n", "activation", 1.0, deps=(rid("blk.n", "input"),)),
        rec(10, "blk", "grad_output", 1.0),
        rec(11, "blk.n", "grad_output", 1.0),
        rec(
            12,
            "blk.n.weight",
            "param_grad",
            weight_grad,
            deps=(rid("blk.n", "grad_output"), rid("blk.n", "input")),
        ),
    ]
    return [r for r in records if not (candidate and r.seq == 11)]


def test_a_record_whose_input_has_no_partner_is_not_an_origin() -> None:
    v = verdict(_norm_grads(False, 1.0), _norm_grads(True, 2.0), phase="backward")
    first = first_of(v)
    assert (first.name, first.origin, first.proven) == ("blk.n.weight", False, False)
    assert first.proof == NoPartner(("blk.n|grad_output|out|0|0",))
    assert proof_text(first.proof) == "origin unproven: input blk.n grad_output has no partner"
    # blk.n's own grad_output is the missing one; blk's was compared and matched.
    assert first.origin_module == "blk"


def test_inputs_that_differed_within_tolerance_are_named_with_their_size() -> None:
    # a's output (b's input) differs by 5e-7 relative: within the float32 tolerance, not zero.
    v = verdict(two_layers(1.0, 1.0, 1.0), two_layers(1.0, 1.0000005, 2.0))
    first = first_of(v)
    assert (first.name, first.origin, first.proven) == ("b", True, True)
    fact = first.proof
    assert isinstance(fact, InputsWithinTolerance) and fact.input_id.startswith("b|input|in.0|")
    assert (round(fact.size, 9), fact.own) == (5e-7, 1.0)
    assert proof_text(first.proof).startswith(
        "its inputs differed within tolerance (up to 5.000e-07 relative, b input in.0)"
    )
    assert "its output by 1.000e+00 (amplified)" in proof_text(first.proof)


def test_inputs_that_matched_exactly_need_no_proof() -> None:
    first = first_of(verdict(two_layers(1.0, 1.0, 1.0), two_layers(1.0, 1.0, 2.0)))
    assert (first.name, first.origin, proof_text(first.proof)) == ("b", True, "")


def _fwd_bwd(out: float, grad: float) -> list[Record]:
    return [
        rec(0, "a", "input", 1.0),
        rec(1, "a", "activation", out, deps=(rid("a", "input"),)),
        rec(2, "a", "grad_output", 1.0),
        rec(3, "a", "grad_input", grad, deps=(rid("a", "grad_output"),)),
    ]


def _case(base: list[Record], cand: list[Record]) -> dict[str, PhaseVerdict]:
    verdicts = {phase: verdict(base, cand, phase=phase) for phase in ("forward", "backward")}
    return dict(tell_case(verdicts, ("forward", "backward")))


def test_after_a_forward_fault_the_backward_phase_is_downstream() -> None:
    told = _case(_fwd_bwd(1.0, 1.0), _fwd_bwd(2.0, 2.0))
    forward, backward = told["forward"], told["backward"]
    assert forward.case_origin is not None and backward.case_origin == forward.case_origin
    origin = forward.case_origin
    assert origin is not None
    assert (origin.module, origin.phase, origin.kind, origin.proven) == ("a", "forward", "activation", True)
    assert (forward.downstream, backward.downstream) == (False, True)
    # The backward keeps its failing record, but claims no origin of its own.
    first = backward.first
    assert first is not None
    assert (first.name, first.origin, first.origin_module) == ("a", False, "a")


def test_a_backward_only_fault_has_its_own_origin() -> None:
    told = _case(_fwd_bwd(1.0, 1.0), _fwd_bwd(1.0, 2.0))
    backward = told["backward"]
    origin = backward.case_origin
    assert origin is not None
    assert (origin.module, origin.phase, origin.kind) == ("a", "backward", "grad_input")
    assert backward.downstream is False
    assert told["forward"].first is None


def test_an_aligned_case_has_no_origin() -> None:
    told = _case(_fwd_bwd(1.0, 1.0), _fwd_bwd(1.0, 1.0))
    assert all(v.case_origin is None for v in told.values())


def test_an_unproven_origin_heads_the_message_as_unproven() -> None:
    told = tell_case(
        {"backward": verdict(_norm_grads(False, 1.0), _norm_grads(True, 2.0), phase="backward")},
        ("backward",),
    )
    origin = told["backward"].case_origin
    assert origin is not None and (origin.module, origin.proven) == ("blk", False)
    report = PhaseReport("t.yaml", "case", "backward", told["backward"], "a", "b", "default", "-")
    lines = failure_message(report).splitlines()
    assert lines[0] == (
        "Origin unproven (backward, step 0): input blk.n grad_output has no partner; "
        "innermost module whose inputs all matched: blk"
    )
    assert "its inputs matched" not in "\n".join(lines)
    first = next(line for line in lines if line.startswith("First divergence"))
    assert first.startswith("First divergence: blk.n.weight (param_grad, out, step 0), origin unproven")


def _masked_block(mask: float, o_in: float, o_out: float) -> list[Record]:
    """model > model.attn > model.attn.o: attn gets hidden states (data) and an attention
    mask (not data) of the same form on both sides; o is fed by attn's code from both."""
    mask_rec = replace(rec(2, "model.attn", "input", mask), slot="in.attention_mask")
    return [
        rec(0, "model", "input", 1.0),
        rec(1, "model.attn", "input", 1.0),
        mask_rec,
        rec(3, "model.attn.o", "input", o_in),
        rec(4, "model.attn.o", "activation", o_out, deps=(rid("model.attn.o", "input"),)),
        rec(5, "model.attn", "activation", o_out, deps=(rid("model.attn", "input"),)),
        rec(6, "model", "activation", o_out, deps=(rid("model", "input"),)),
    ]


def test_a_mask_that_differs_in_value_is_the_evidence_not_a_reason_to_climb_to_the_root() -> None:
    # Packing attending across sequences: attn's hidden states match, its mask (same shape and
    # dtype) has other values, so what o receives differs. The origin is attn, through its mask.
    first = first_of(verdict(_masked_block(1.0, 1.0, 1.0), _masked_block(2.0, 1.5, 3.0)))
    assert (first.name, first.origin, first.proven) == ("model.attn.o", False, True)
    assert first.origin_module == "model.attn"
    assert first.proof == SteeringInputs(("attention_mask",))
    assert proof_text(first.proof).startswith("its data inputs matched, its attention_mask did not")
    told = tell_case(
        {"forward": verdict(_masked_block(1.0, 1.0, 1.0), _masked_block(2.0, 1.5, 3.0))}, ("forward",)
    )
    origin = told["forward"].case_origin
    assert origin is not None and origin.module == "model.attn"
    assert "attention_mask did not" in case_origin_text(origin)


def test_a_data_input_that_differs_still_climbs_past_the_module() -> None:
    # The same block with the mask matching: attn's inputs all match, it is named as before.
    first = first_of(verdict(_masked_block(1.0, 1.0, 1.0), _masked_block(1.0, 1.5, 3.0)))
    assert (first.origin_module, proof_text(first.proof)) == ("model.attn", "")


def test_a_failure_grown_from_a_difference_under_tolerance_names_where_the_step_first_moved() -> None:
    # bf16 RMSNorm rounding twice (transformers PR #29402): a's output moves by 1e-6 relative on
    # identical inputs (within tolerance), b amplifies nothing and fails only because its values
    # are larger. The step was identical up to a: a is where the sides part.
    base = two_layers(1.0, 1.0, 100.0)
    first = first_of(verdict(base, two_layers(1.000001, 1.000001, 100.0009)))
    assert (first.name, first.origin, first.proven) == ("b", False, True)
    assert first.origin_module == "a"
    fact = first.proof
    assert isinstance(fact, MovedOutput) and fact.failing.startswith("b|activation|")
    assert fact.size is not None and abs(fact.size - 1e-6) < 1e-9
    assert proof_text(first.proof).startswith(
        "the first output of the step to differ at all (by 1.000e-06 relative"
    )
    # a's own input moved too: nothing before the failure was identical, no module is named so
    moved_input = two_layers(1.000001, 1.000001, 100.0009)
    moved_input[0] = rec(0, "a", "input", 1.000001)
    first = first_of(verdict(base, moved_input))
    assert first.origin_module != "a" and "differ at all" not in proof_text(first.proof)


def _rotary(release: str) -> list[Record]:
    """attn > attn.rotary: Mistral's rotary embedding across transformers 4.41 and 4.42. In
    4.42 it takes position_ids as a second positional input and returns cos/sin [1, 4, 8]; in
    4.41 it takes seq_len as an int (not recorded) and returns [4, 8]: the same values."""
    new = release == "4.42"
    positions = "attn.rotary|input|in.1|0|0"
    cos = replace(
        rec(3, "attn.rotary", "activation", 1.0),
        shape=(1, 4, 8) if new else (4, 8),
        deps=(rid("attn.rotary", "input"), positions) if new else (rid("attn.rotary", "input"),),
    )
    records = [
        rec(0, "attn", "input", 1.0),
        rec(1, "attn.rotary", "input", 1.0),
        replace(rec(2, "attn.rotary", "input", 3.0, dtype="int64"), slot="in.1", shape=(1, 4)),
        cos,
        rec(4, "attn.o", "input", 1.0),
        rec(5, "attn.o", "activation", 1.0, deps=(rid("attn.o", "input"),)),
        rec(6, "attn", "activation", 1.0, deps=(rid("attn", "input"),)),
    ]
    return [r for r in records if new or r.slot != "in.1"]


def test_an_output_that_only_gained_a_dimension_of_size_1_across_releases_is_compared() -> None:
    # The clean twin of sliding_window_off_by_one (transformers 4.42.0 vs 4.41.2): rotary's
    # output differs in form only and every record matches: the phase passes.
    v = verdict(_rotary("4.42"), _rotary("4.41"))
    assert v.passed and v.first is None
    manifest = {"record_mode": "stats"}
    pairs = compare_traces(
        Trace(manifest, tuple(_rotary("4.42"))), Trace(manifest, tuple(_rotary("4.41"))), default_table()
    )
    cos = next(p for p in pairs.pairs if p.record.name == "attn.rotary" and p.record.kind == "activation")
    assert cos.status == "ok" and "differ only in dimensions of size 1" in cos.note
    # Fail closed: other values in that form still fail, named by their statistics, not shape.
    other = _rotary("4.41")
    other[2] = replace(other[2], stats=rec(0, "x", "input", 2.0).stats)
    first = first_of(verdict(_rotary("4.42"), other))
    assert (first.name, first.metric.startswith("stats.")) == ("attn.rotary", True)
    # its positions, an input on one side only, leave the origin unproven, not claimed
    assert (first.origin, first.proven, first.origin_module) == (False, False, "attn")
    assert proof_text(first.proof) == "origin unproven: input attn.rotary input in.1 has no partner"


def _moved_after_mask(
    form: tuple[int, ...], norm_out: float, fed_by_mask: bool, mask: float = 1.0
) -> list[Record]:
    """layer > layer.norm, then layer.b: the layer's attention mask comes first (one form on
    one release, another on the other: set aside); norm's output moves within tolerance on
    identical inputs (and on the mask when ``fed_by_mask``); b, fed by norm, fails."""
    mask_rec = replace(rec(1, "layer", "input", mask), slot="in.attention_mask", shape=form)
    norm_deps = (rid("layer.norm", "input"), mask_rec.id) if fed_by_mask else (rid("layer.norm", "input"),)
    return [
        rec(0, "layer", "input", 1.0),
        mask_rec,
        rec(2, "layer.norm", "input", 1.0),
        rec(3, "layer.norm", "activation", norm_out, deps=norm_deps),
        rec(4, "layer.b", "input", norm_out),
        rec(
            5,
            "layer.b",
            "activation",
            100.0 if norm_out == 1.0 else 100.0009,
            deps=(rid("layer.b", "input"),),
        ),
    ]


def test_a_mask_set_aside_before_it_does_not_hide_where_the_step_first_moved() -> None:
    # gemma_rmsnorm_bf16 across transformers 4.38.2 and 4.39.0: the mask changed form (set
    # aside; its values differ too), norm's bf16 output moved within tolerance on identical inputs, b failed from it.
    base = _moved_after_mask((1, 4), 1.0, False)
    first = first_of(verdict(base, _moved_after_mask((2, 2), 1.000001, False, mask=5.0)))
    assert (first.name, first.origin_module, first.proven) == ("layer.b", "layer.norm", True)
    assert proof_text(first.proof).startswith("the first output of the step to differ at all")
    # Fail closed: an output computed from the set-aside mask is not named by this rule (its
    # inputs were not all compared).
    fed = first_of(
        verdict(_moved_after_mask((1, 4), 1.0, True), _moved_after_mask((2, 2), 1.000001, True, mask=5.0))
    )
    assert "differ at all" not in proof_text(fed.proof)


def _scaled_embeddings(scale: float, with_model_inputs: bool = True) -> list[Record]:
    """model > model.emb, model.layer > model.layer.b: model scales emb's output in its own code
    before the layer (Gemma's normaliser); b fails from the layer's input, amplifying nothing."""
    records = [
        rec(0, "model", "input", 1.0),
        rec(1, "model.emb", "input", 1.0),
        rec(2, "model.emb", "activation", 1.0, deps=(rid("model.emb", "input"),)),
        rec(3, "model.layer", "input", scale),
        rec(4, "model.layer.b", "input", scale),
        rec(5, "model.layer.b", "activation", 100.0 * scale, deps=(rid("model.layer.b", "input"),)),
    ]
    return records if with_model_inputs else records[1:]


def test_an_input_that_moved_after_identical_records_names_the_module_whose_code_made_it() -> None:
    # gemma_normalizer_dtype (transformers 4.38.2 vs 4.39.0): the bf16-rounded normaliser
    # scales the embeddings in GemmaModel.forward; embed_tokens' output is identical, the first
    # layer's input moves within tolerance, a projection fails later: model's own code made it.
    first = first_of(verdict(_scaled_embeddings(1.0), _scaled_embeddings(1.000009)))
    assert (first.name, first.origin_module, first.proven) == ("model.layer.b", "model", True)
    assert proof_text(first.proof).startswith(
        "the first record of the step to differ at all is model.layer input in.0 (by 9.000e-06 relative"
    )
    # Fail closed: without model's inputs recorded nothing vouches for its code: not named so.
    bare = first_of(verdict(_scaled_embeddings(1.0, False), _scaled_embeddings(1.000009, False)))
    assert "differ at all" not in proof_text(bare.proof)
