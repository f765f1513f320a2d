"""The verdict's rules (verdict/phase.py), one test each, on records written as data: no
models, no torch. Each builds a baseline and a candidate trace of statistics records, compares
them under the default table and asserts the named first divergence, origin, status or message.

Record ids are ``name|kind|slot|step|call``; ``deps`` name the records a record was computed
from (a module output's deps are its inputs), as the recorder writes them."""

from __future__ import annotations

import pytest

from pytest_precalign.compare.op_pairing import settle_op_pairs
from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable, default_table
from pytest_precalign.reports.coverage_text import coverage_problem_text, coverage_text
from pytest_precalign.reports.origin_text import choice_text
from pytest_precalign.reports.training_evidence_text import proof_text
from pytest_precalign.specs.coverage import DEFAULT_MIN_COVERAGE
from pytest_precalign.trace.records import Record, Stats, Trace, record_id
from pytest_precalign.verdict.coverage import NothingPaired, NothingRecorded, PairingHint, TooLittle
from pytest_precalign.verdict.origin_facts import ApiCallEarlier, LowerPrecisionFirst
from pytest_precalign.verdict.phase import AMPLIFY, Divergence, NonFinite, PhaseVerdict, phase_verdict

SLOTS = {"input": "in.0", "grad_input": "in.0"}  # every other kind: "out"


def rec(
    seq: int,
    name: str,
    kind: str,
    scale: float = 1.0,
    *,
    dtype: str = "float32",
    deps: tuple[str, ...] = (),
    module_class: str = "M",
    call: int = 0,
    nan: int = 0,
    inf: int = 0,
) -> Record:
    """A record whose statistics are those of a tensor spanning [-scale, scale]."""
    phase = {"grad_output": "backward", "grad_input": "backward", "param_grad": "backward"}.get(
        kind, "forward"
    )
    stats = Stats(max=scale, min=-scale, mean=0.0, norm=2 * scale, nan=nan, inf=inf)
    return Record(
        seq,
        name,
        module_class,
        phase,
        0,
        call,
        kind,
        SLOTS.get(kind, "out"),
        dtype,
        (4,),
        stats=stats,
        deps=deps,
    )


def rid(name: str, kind: str, call: int = 0) -> str:
    return record_id(name, kind, SLOTS.get(kind, "out"), 0, call)


def verdict(
    base: list[Record],
    cand: list[Record],
    phase: str = "forward",
    parents: dict[str, str] | None = None,
    level: str = "module",
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> PhaseVerdict:
    manifest = {"record_mode": "stats", "record_level": level}
    baseline, candidate = Trace(manifest, tuple(base)), Trace(manifest, tuple(cand))
    comparison = settle_op_pairs(compare_traces(baseline, candidate, default_table()), baseline, candidate)
    return phase_verdict(comparison, phase, None, False, parents=parents, min_coverage=min_coverage)


def first_of(v: PhaseVerdict) -> Divergence:
    assert v.first is not None, "the phase has no divergence"
    return v.first


def two_layers(a_out: float, b_in: float, b_out: float) -> list[Record]:
    """a then b, b fed by a; the input of a is the same on both sides."""
    return [
        rec(0, "a", "input", 1.0),
        rec(1, "a", "activation", a_out, deps=(rid("a", "input"),)),
        rec(2, "b", "input", b_in),
        rec(3, "b", "activation", b_out, deps=(rid("b", "input"),)),
    ]


# -- origin vs propagated -----------------------------------------------------------------------


def test_divergence_whose_inputs_are_aligned_is_the_origin() -> None:
    v = verdict(two_layers(1.0, 1.0, 2.0), two_layers(1.5, 1.5, 3.0))
    first = first_of(v)
    # b fails too, but a comes first in execution order and its input matched.
    assert (first.name, first.kind, first.origin, first.origin_module) == ("a", "activation", True, "a")
    assert first.metric.startswith("stats.") and first.value > first.allowed
    assert {p.record.name for p in v.failures} == {"a", "b"} and not v.passed


def test_divergence_whose_input_already_diverged_is_propagated_into_the_enclosing_module() -> None:
    def block(up_in: float, up_out: float) -> list[Record]:
        # blk's own code between its input and blk.up changes what blk.up receives
        return [
            rec(0, "blk", "input", 1.0),
            rec(1, "blk.up", "input", up_in),
            rec(2, "blk.up", "activation", up_out, deps=(rid("blk.up", "input"),)),
            rec(3, "blk", "activation", up_out, deps=(rid("blk", "input"),)),
        ]

    first = first_of(verdict(block(1.0, 2.0), block(1.5, 3.0)))
    assert (first.name, first.origin) == ("blk.up", False)
    assert first.origin_module == "blk"  # the innermost enclosing module whose inputs matched


# -- backward: the grad_output is the consumer's grad_input -------------------------------------


def _backward(b_grad_out: float, a_grad_out: float) -> list[Record]:
    """b consumes a's output. Backward runs b first: b's grad_output, then the grad w.r.t. b's
    input, which is one tensor recorded as a's grad_output (its hook fires first) and right after
    as b's grad_input."""
    return [
        rec(0, "b", "grad_output", b_grad_out),
        rec(1, "a", "grad_output", a_grad_out),
        rec(2, "b", "grad_input", a_grad_out, deps=(rid("b", "grad_output"),)),
    ]


def test_grad_output_is_handed_to_the_consumers_grad_input_as_the_backward_origin() -> None:
    first = first_of(verdict(_backward(1.0, 2.0), _backward(1.0, 3.0), phase="backward"))
    # a's grad_output fails first, but b's backward made it from a grad_output that matched.
    assert (first.name, first.kind, first.slot, first.origin) == ("b", "grad_input", "in.0", True)


def test_grad_output_made_from_a_diverged_grad_stays_propagated() -> None:
    first = first_of(verdict(_backward(1.0, 2.0), _backward(1.5, 3.0), phase="backward"))
    # b's own grad_output already differed: nothing is handed over, and a grad_output is never
    # an origin (its consumers' backward made it).
    assert (first.name, first.kind, first.origin) == ("b", "grad_output", False)


# -- a lower-precision layer before the failure ------------------------------------------------


def test_lower_precision_layer_is_reported_before_the_failing_one() -> None:
    base = two_layers(1.0, 1.0, 10.0)
    # a ran in bf16 on the candidate: 1e-3 off passes bf16's tolerance; b (fp32 on both sides)
    # is 1e-2 off, over fp32's.
    cand = two_layers(1.0, 1.0, 10.01)
    cand[1] = rec(1, "a", "activation", 1.001, dtype="bfloat16", deps=(rid("a", "input"),))
    v = verdict(base, cand)
    assert [p.record.name for p in v.failures] == ["b"]
    first = first_of(v)
    assert (first.name, first.origin) == ("a", True)
    assert first.why == LowerPrecisionFirst("bfloat16", "float32", "bfloat16", "b", "float32")
    assert choice_text(first.why) == (
        "dtype bfloat16 (candidate) vs float32 (baseline): within the bfloat16 tolerance, "
        "but b fails after it under the float32 tolerance"
    )


def test_a_lower_precision_layer_passing_the_failures_own_rule_is_not_the_start() -> None:
    # A table rule for every dtype (a mixed-precision run's): a passed under the same bounds as
    # b, not a looser bf16 default, so b is where the sides start to differ.
    base = two_layers(1.0, 1.0, 10.0)
    cand = two_layers(1.0, 1.0, 10.01)
    cand[1] = rec(1, "a", "activation", 1.001, dtype="bfloat16", deps=(rid("a", "input"),))
    table = ToleranceTable(name="mixed", rules=(ToleranceRule(atol=2e-3, rtol=0.0),))
    baseline, candidate = (Trace({"record_mode": "stats"}, tuple(r)) for r in (base, cand))
    comparison = settle_op_pairs(compare_traces(baseline, candidate, table), baseline, candidate)
    first = first_of(phase_verdict(comparison, "forward", None, False))
    assert (first.name, first.why) == ("b", None)


def test_run_in_lower_precision_throughout_names_the_failing_layer() -> None:
    base = two_layers(1.0, 1.0, 10.0)
    cand = two_layers(1.0, 1.0, 10.5)
    cand[1] = rec(1, "a", "activation", 1.001, dtype="bfloat16", deps=(rid("a", "input"),))
    cand[3] = rec(3, "b", "activation", 10.5, dtype="bfloat16", deps=(rid("b", "input"),))
    first = first_of(verdict(base, cand))  # b fails even under bf16's tolerance
    assert (first.name, first.why) == ("b", None)


# -- statistics: an origin only when amplified -------------------------------------------------


@pytest.mark.parametrize(("factor", "origin"), [(0.9, False), (1.1, True)])
def test_statistics_origin_needs_the_change_to_exceed_its_inputs_by_amplify(
    factor: float, origin: bool
) -> None:
    base = [rec(0, "a", "input", 1e-3), rec(1, "a", "activation", 1.0, deps=(rid("a", "input"),))]
    # The input moved 1e-4 relative: within the absolute tolerance, so it "matched".
    moved = 1e-4
    out = 1.0 + factor * AMPLIFY * moved
    cand = [rec(0, "a", "input", 1e-3 * (1 + moved)), rec(1, "a", "activation", out)]
    v = verdict(base, cand)
    assert [p.record.name for p in v.failures] == ["a"]
    first = first_of(v)
    assert (first.name, first.evidence, first.origin) == ("a", "stats", origin)


def test_statistics_origin_on_an_unchanged_input() -> None:
    base = [rec(0, "a", "input", 1e-3), rec(1, "a", "activation", 1.0, deps=(rid("a", "input"),))]
    cand = [rec(0, "a", "input", 1e-3), rec(1, "a", "activation", 1.0004)]
    assert first_of(verdict(base, cand)).origin is True


# -- mix level: the module, with the op as detail -----------------------------------------------


def _mix(soft: float, out: float) -> list[Record]:
    return [
        rec(0, "attn", "input", 1.0),
        rec(1, "attn.Functional.softmax", "activation", soft, module_class="api"),
        rec(2, "attn", "activation", out, deps=(rid("attn", "input"),)),
    ]


PARENTS = {"attn.Functional.softmax#0": "attn#0", "attn#0": ""}


def test_mix_level_names_the_module_with_the_op_as_detail() -> None:
    v = verdict(_mix(1.0, 2.0), _mix(1.5, 3.0), parents=PARENTS, level="mix")
    assert [p.record.name for p in v.failures] == ["attn.Functional.softmax", "attn"]
    first = first_of(v)
    # The op fails first, inside attn; the layer named is attn, its own inputs matched.
    assert (first.name, first.origin, first.origin_module) == ("attn", True, "attn")
    assert first.first_op == "Functional.softmax.0.forward in attn"


def test_op_level_trace_names_the_module_the_op_ran_in() -> None:
    def ops(soft: float) -> list[Record]:
        return [rec(0, "attn.Functional.softmax", "activation", soft, module_class="api")]

    first = first_of(verdict(ops(1.0), ops(1.5), parents={"attn.Functional.softmax#0": "attn#0"}, level="op"))
    assert (first.name, first.origin, first.first_op) == (
        "attn",
        True,
        "Functional.softmax.0.forward in attn",
    )


def test_an_op_diverging_earlier_outside_the_failing_module_is_where_it_enters() -> None:
    def trace(soft: float, out: float) -> list[Record]:
        return [
            rec(0, "attn.Functional.softmax", "activation", soft, module_class="api"),
            rec(1, "attn", "activation", 1.0),  # attn's own output still passes
            rec(2, "mlp", "input", 1.0),
            rec(3, "mlp", "activation", out, deps=(rid("mlp", "input"),)),
        ]

    first = first_of(verdict(trace(1.0, 2.0), trace(1.5, 3.0), parents=PARENTS, level="mix"))
    assert (first.name, first.origin, first.origin_module) == ("mlp", False, "attn")
    assert first.why == ApiCallEarlier("Functional.softmax.0.forward in attn")
    assert (
        choice_text(first.why)
        == "the API call Functional.softmax.0.forward in attn diverged earlier, outside it"
    )


# -- unmatched op calls: reasons, not failures --------------------------------------------------


def test_unmatched_op_calls_become_reasons_not_failures() -> None:
    def ops(act: str, casts: int) -> list[Record]:
        records = [
            rec(0, "mlp", "input", 1.0),
            rec(1, f"mlp.Functional.{act}", "activation", 1.0, module_class="api"),
        ]
        records += [
            rec(2 + i, "mlp.Tensor.to", "activation", 1.0, module_class="api", call=i) for i in range(casts)
        ]
        return [*records, rec(9, "mlp", "activation", 2.0, deps=(rid("mlp", "input"),))]

    # Two of the baseline's three outputs are op calls the candidate does not make (explained
    # below): 1 of 3 paired, legitimately under the default floor in a trace this small.
    v = verdict(ops("silu", 1), ops("gelu", 2), level="op", min_coverage=0.3)
    assert v.failures == () and v.passed and v.first is None
    assert v.coverage is not None and (v.coverage.paired, v.coverage.outputs) == (1, 3)
    assert v.coverage.unexplained == 0  # every unmatched record has its reason
    assert not verdict(ops("silu", 1), ops("gelu", 2), level="op").passed  # the default floor, 0.5
    assert v.reasons == {
        rid("mlp.Functional.silu", "activation"): "op call only in the baseline: the candidate makes no "
        "Functional.silu call in mlp",
        rid("mlp.Functional.gelu", "activation"): "op call only in the candidate: the baseline makes no "
        "Functional.gelu call in mlp",
        # calls counted differently are not paired by index: every one of them is unmatched
        **dict.fromkeys(
            (rid("mlp.Tensor.to", "activation", c) for c in (0, 1)),
            "Tensor.to is called 1 times in mlp by the baseline and 2 times by the candidate: "
            "its calls are not paired by index",
        ),
    }
    assert {r.name for r in v.only_baseline} == {"mlp.Functional.silu", "mlp.Tensor.to"}
    assert {(r.name, r.call) for r in v.only_candidate} == {
        ("mlp.Functional.gelu", 0),
        ("mlp.Tensor.to", 0),
        ("mlp.Tensor.to", 1),
    }


def test_l1_dump_names_the_one_sided_calls_just_before_the_divergence() -> None:
    # An L1 (API-only) msprobe dump: no module tree, each call's parent is "".
    def calls(act: str, lin_in: float, lin_out: float) -> list[Record]:
        return [
            rec(0, "Functional.linear", "activation", 1.0, module_class="api"),
            rec(1, f"Functional.{act}", "activation", 1.0, module_class="api"),
            rec(2, "Functional.linear", "input", lin_in, module_class="api", call=1),
            rec(3, "Functional.linear", "activation", lin_out, module_class="api", call=1,
                deps=(rid("Functional.linear", "input", 1),)),
        ]  # fmt: skip

    parents = {f"{n}#{c}": "" for n, c in [("Functional.linear", 0), ("Functional.linear", 1)]}
    parents |= {"Functional.silu#0": "", "Functional.gelu#0": ""}
    v = verdict(calls("silu", 1.0, 2.0), calls("gelu", 1.5, 3.0), parents=parents)
    first = first_of(v)
    assert (first.name, first.call, first.origin, first.proven) == ("Functional.linear", 1, False, False)
    # The one-sided calls have no partner: a hint in the proof, never the origin module.
    assert first.origin_module == ""
    assert proof_text(first.proof).endswith(
        "only one side made just before it: "
        "Functional.silu.0.forward (baseline only) / Functional.gelu.0.forward (candidate only)"
    )
    assert [p.record.name for p in v.failures] == ["Functional.linear"]  # the one-sided calls are not


# -- NaN/Inf: the first occurrence per side -----------------------------------------------------


def test_first_nan_or_inf_of_each_side_is_reported_and_fails() -> None:
    base = [
        rec(0, "a", "input", 1.0),
        rec(1, "a", "activation", 1.0, deps=(rid("a", "input"),)),
        rec(2, "b", "input", 1.0),
        rec(3, "b", "activation", 1.0, deps=(rid("b", "input"),)),
        rec(4, "c", "activation", 1.0),
    ]
    cand = [
        rec(0, "a", "input", 1.0, nan=1),  # inputs are not reported: the module's output is
        rec(1, "a", "activation", 1.0, deps=(rid("a", "input"),)),
        rec(2, "b", "input", 1.0),
        rec(3, "b", "activation", 1.0, nan=2, deps=(rid("b", "input"),)),
        rec(4, "c", "activation", 1.0, inf=1),
    ]
    v = verdict(base, cand)
    assert v.nonfinite == (NonFinite("candidate", cand[3]),)
    first = first_of(v)
    assert (first.name, first.metric, first.value, first.origin) == ("b", "nonfinite", 2.0, True)
    # Overflow levels: a received a NaN and is finite again; b and c made theirs.
    assert [(o.record.name, o.level) for o in v.overflow] == [
        ("a", "medium"),
        ("b", "critical"),
        ("c", "critical"),
    ]
    assert not v.passed
    # The same NaN on both sides: reported for each side, and a failure (NaN is not a value,
    # torch.testing's equal_nan=False; a rule's equal_nan: true accepts it -- issue #34).
    same = verdict(cand, cand)
    assert same.nonfinite == (NonFinite("baseline", cand[3]), NonFinite("candidate", cand[3]))
    assert same.overflow == () and not same.passed
    assert {p.failing.metric for p in same.failures if p.failing} == {"nonfinite_shared"}


# -- nothing compared --------------------------------------------------------------------------


def test_a_phase_in_which_nothing_was_compared_fails() -> None:
    base = [rec(0, "a", "input", 1.0), rec(1, "a", "activation", 1.0)]
    cand = [rec(0, "x", "input", 1.0), rec(1, "x", "activation", 1.0)]  # no name in common
    v = verdict(base, cand)
    assert v.compared == 0
    assert not v.passed
    assert v.aligned  # nothing failed: it is the coverage that fails the phase
    assert v.coverage is not None and v.coverage.ratio == 0.0
    assert coverage_problem_text(v.coverage).startswith(
        "nothing compared: all 1 baseline forward output records found no"
    )
    assert v.coverage.problem == NothingPaired(PairingHint("names_differ", "modules", "modules"))
    assert "the names differ between the sides" in coverage_problem_text(v.coverage)
    assert (v.coverage.unexplained_baseline, v.coverage.unexplained_candidate) == (1, 1)


def test_nothing_compared_fails_even_with_a_floor_of_zero() -> None:
    base = [rec(0, "a", "input", 1.0), rec(1, "a", "activation", 1.0)]
    cand = [rec(0, "x", "input", 1.0), rec(1, "x", "activation", 1.0)]
    assert not verdict(base, cand, min_coverage=0.0).passed


def test_a_phase_no_side_recorded_fails() -> None:
    v = verdict([rec(1, "a", "activation", 1.0)], [rec(1, "a", "activation", 1.0)], phase="backward")
    assert not v.passed and v.coverage is not None
    assert v.coverage.problem == NothingRecorded()
    assert (
        coverage_problem_text(v.coverage)
        == "nothing compared: neither side recorded a backward output record"
    )


def test_modules_against_api_calls_are_named_an_l0_and_an_l1_dump() -> None:
    base = [rec(i, f"layers.{i}", "activation", 1.0) for i in range(3)]
    cand = [rec(i, "Functional.linear", "activation", 1.0, module_class="api", call=i) for i in range(4)]
    v = verdict(base, cand)
    assert v.coverage is not None and not v.passed
    assert v.coverage.problem == NothingPaired(PairingHint("levels_differ", "modules", "APIs"))
    assert coverage_problem_text(v.coverage) == (
        "nothing compared: all 3 baseline forward output records found no partner (4 candidate-only); "
        "the sides look like an L0 and an L1 dump (baseline: modules only, candidate: APIs only): "
        "record both at the same level"
    )


@pytest.mark.parametrize(("paired", "floor", "passed"), [(2, 0.5, True), (1, 0.5, False), (1, 0.25, True)])
def test_coverage_under_the_floor_fails(paired: int, floor: float, passed: bool) -> None:
    base = [rec(i, f"m{i}", "activation", 1.0) for i in range(4)]
    cand = [rec(i, f"m{i}", "activation", 1.0) for i in range(paired)]
    v = verdict(base, cand, min_coverage=floor)
    assert v.aligned and v.passed is passed and v.coverage is not None
    assert v.coverage.ratio == paired / 4
    assert (v.coverage.only_baseline, v.coverage.unexplained_baseline) == (4 - paired, 4 - paired)
    assert coverage_problem_text(v.coverage).startswith("too little compared: ") is not passed
    assert v.coverage.problem == (None if passed else TooLittle(PairingHint("candidate_none", "modules")))
    assert coverage_text(v.coverage) == (
        f"coverage {paired * 25}% ({paired} of 4 baseline forward output records paired; floor {floor:.0%})"
    )
    if not passed:
        assert "the candidate recorded none of them" in coverage_problem_text(v.coverage)


def test_a_divergence_fails_whatever_the_coverage() -> None:
    base = [rec(i, f"m{i}", "activation", 1.0) for i in range(2)]
    cand = [rec(0, "m0", "activation", 1.0), rec(1, "m1", "activation", 3.0)]
    v = verdict(base, cand)
    assert v.coverage is not None and v.coverage.ok and v.coverage.ratio == 1.0
    assert not v.passed and not v.aligned
