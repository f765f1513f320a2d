"""The training-run verdict (verdict/training_run.py) on per-step scalars and plans written as
data: the first divergent step, what diverged first (a training-loop difference is never
blamed on a layer), whole-model patterns, the two lanes, and a run that fails closed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable, default_table
from pytest_precalign.reports.run_pattern_text import pattern_text
from pytest_precalign.reports.training_evidence_text import evidence_text, finding_text
from pytest_precalign.reports.training_json import training_dict
from pytest_precalign.reports.training_text import downstream_text
from pytest_precalign.trace.records import Trace
from pytest_precalign.trace.step_scalars import StepScalars
from pytest_precalign.trace.training_record import RunRecord, TrainingPlan
from pytest_precalign.verdict.training_records import step_records
from pytest_precalign.verdict.training_run import TrainingVerdict, judge_run

from ..helpers.run_records import planned
from .test_rules import rec, rid, two_layers

STEPS = 10


def run(**changes: object) -> dict[int, StepScalars]:
    """A 10-step run's scalars; ``changes`` maps a field to a function of the step."""
    out = {}
    for s in range(STEPS):
        base = StepScalars(
            step=s,
            loss=5.6 - 0.01 * s,
            lr=(1e-3, 1e-3),
            weight_decay=(0.01, 0.0),
            grad_norm=2.0 - 0.1 * s,
            clip_coef=1.0,
            param_norm=30.0 + 0.01 * s,
            update_norm=0.05,
            tokens=64,
            batch_hash=f"{s:064x}",
            micro_batches=1,
        )
        out[s] = replace(base, **{k: f(s) for k, f in changes.items()})  # type: ignore[operator]
    return out


def judge(base: dict[int, StepScalars], cand: dict[int, StepScalars], **kw: object) -> TrainingVerdict:
    return judge_run(RunRecord(scalars=base), RunRecord(scalars=cand), {}, kw.get("table", default_table()))  # type: ignore[arg-type]


def first(v: TrainingVerdict) -> tuple[int, str, str]:
    assert v.first is not None, "the run is aligned"
    return v.first.step, v.first.what, v.first.origin


def test_identical_runs_are_aligned_over_every_step() -> None:
    v = judge(run(), run())
    assert v.passed and v.steps_compared == STEPS
    assert training_dict(v)["first_divergent_step"] is None


def test_a_warmup_one_step_behind_is_the_schedule_not_a_layer() -> None:
    warm = [0.0, 5e-4, 1e-3, 1e-3]
    behind = [0.0, 0.0, 5e-4, 1e-3]
    v = judge(run(lr=lambda s: (warm[min(s, 3)],) * 2), run(lr=lambda s: (behind[min(s, 3)],) * 2))
    assert first(v) == (1, "schedule", "lr[0]")
    assert v.first is not None and "lr at step 1: 5.000e-04 vs 0.000e+00" in evidence_text(v.first.evidence)
    assert downstream_text(v) == "steps 2-9 are downstream of it"
    assert pattern_text(v.first.pattern) == "the candidate's schedule is 1 step(s) behind the baseline's"


def test_the_same_lr_factor_on_every_group_is_named_as_a_whole_model_pattern() -> None:
    v = judge(run(), run(lr=lambda s: (5e-4, 5e-4)))
    assert first(v) == (0, "schedule", "lr[0]")
    assert v.first is not None and "every parameter moved by the same factor (LR x0.5)" in pattern_text(
        v.first.pattern
    )


def test_clipping_on_one_side_only_is_clipping() -> None:
    v = judge(run(), run(clip_coef=lambda s: 0.5))
    assert first(v) == (0, "clipping", "clip_coef")
    assert v.first is not None and pattern_text(v.first.pattern).startswith("only the candidate clipped")


def test_a_different_micro_batch_split_is_said_as_such() -> None:
    v = judge(run(), run(micro_batches=lambda s: 2))
    assert first(v) == (0, "settings", "micro_batches")
    assert (
        v.first is not None
        and pattern_text(v.first.pattern) == "the sides split the step into 1 and 2 micro-batches"
    )


def test_grads_twice_as_large_are_the_grad_reduction() -> None:
    v = judge(run(), run(grad_norm=lambda s: 2 * (2.0 - 0.1 * s)))
    assert first(v) == (0, "grad_reduction", "grad_norm")


def test_a_bug_from_step_5_is_found_at_step_5() -> None:
    v = judge(run(), run(loss=lambda s: 5.6 - 0.01 * s + (1e-3 if s >= 5 else 0.0)))
    assert first(v) == (5, "loss", "loss")
    assert v.first is not None and "record layers" in evidence_text(v.first.evidence)


def test_a_different_batch_is_data() -> None:
    v = judge(run(), run(batch_hash=lambda s: f"{s + (1 if s >= 3 else 0):064x}"))
    assert first(v) == (3, "data", "batch")


def test_the_exact_lane_fails_what_the_approximate_lane_allows() -> None:
    cand = run(loss=lambda s: (5.6 - 0.01 * s) * (1 + 1e-9))
    assert judge(run(), cand).passed
    exact = ToleranceTable("exact", (ToleranceRule(atol=0.0, rtol=0.0),))
    v = judge(run(), cand, table=exact)
    assert v.lane == "exact" and first(v) == (0, "loss", "loss")


def test_an_update_difference_is_judged_in_the_exact_lane_only() -> None:
    cand = run(update_norm=lambda s: 0.0500001)
    assert judge(run(), cand).passed  # AdamW amplifies: judged by its inputs, not this number
    exact = ToleranceTable("exact", (ToleranceRule(atol=0.0, rtol=0.0),))
    assert first(judge(run(), cand, table=exact)) == (0, "optimizer_update", "update_norm")


@pytest.mark.parametrize(
    ("cand", "finding"),
    [
        ({s: x for s, x in run().items() if s < 8}, "steps 8-9 recorded by the baseline only"),
        (run(grad_norm=lambda s: None), "grad_norm recorded by the baseline only (steps 0-9)"),
        (run(skipped=lambda s: s == 3), "the candidate skipped the update of step 3"),
    ],
)
def test_a_run_that_does_not_line_up_fails_closed(cand: dict[int, StepScalars], finding: str) -> None:
    v = judge(run(), cand)
    assert not v.passed
    assert any(finding_text(f).startswith(finding) for f in v.findings), v.findings


def plan(lr: list[float], groups: list[list[str]], **kw: object) -> TrainingPlan:
    settings: dict[str, object] = {
        "clip_grad": 1.0,
        "micro_batches": 1,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "optimizer": "adamw",
        **kw,
    }
    return TrainingPlan(
        lr=tuple((x,) * len(groups) for x in lr),
        weight_decay=(0.01, 0.0)[: len(groups)],
        groups=tuple(tuple(g) for g in groups),
        **settings,  # type: ignore[arg-type]
    )


def cosine(steps: int, horizon: int, peak: float = 1e-3) -> list[float]:
    import math

    return [peak * 0.5 * (1 + math.cos(math.pi * min(s, horizon) / horizon)) for s in range(steps)]


GROUPS = [["w", "layer.weight"], ["norm.weight", "layer.bias"]]


def contract(base: TrainingPlan, cand: TrainingPlan) -> TrainingVerdict:
    return judge_run(RunRecord(planned(base), run()), RunRecord(planned(cand), run()), {}, default_table())


def test_a_shorter_decay_horizon_fails_the_contract_at_its_first_step() -> None:
    v = contract(plan(cosine(10, 10), GROUPS), plan(cosine(10, 8), GROUPS))
    assert first(v) == (1, "settings", "lr")
    assert v.first is not None
    assert "lr at step 1: 9.755e-04 vs 9.619e-04" in evidence_text(v.first.evidence)
    assert (
        pattern_text(v.first.pattern)
        == "same peak, the decay ends at step 8 vs after the last planned step: another decay horizon"
    )


def test_a_warmup_one_step_behind_in_the_plans() -> None:
    v = contract(plan([0, 5e-4, 1e-3, 1e-3, 1e-3], GROUPS), plan([0, 0, 5e-4, 1e-3, 1e-3], GROUPS))
    assert first(v) == (1, "settings", "lr")
    assert (
        v.first is not None
        and pattern_text(v.first.pattern) == "the candidate's schedule is 1 step(s) behind the baseline's"
    )


def test_weight_decay_on_norms_is_named_with_a_parameter() -> None:
    cand_groups = [["w", "layer.weight", "norm.weight"], ["layer.bias"]]
    v = contract(plan([1e-3] * 3, GROUPS), plan([1e-3] * 3, cand_groups))
    assert first(v) == (0, "settings", "weight_decay")
    assert v.first is not None and "weight_decay of norm.weight: 0 vs 0.01" in evidence_text(v.first.evidence)


def test_clipping_configured_on_one_side_only_is_a_contract_difference() -> None:
    v = contract(plan([1e-3] * 3, GROUPS), plan([1e-3] * 3, GROUPS, clip_grad=None))
    assert first(v) == (0, "settings", "clip_grad")


def test_an_sgd_plan_and_an_adam_plan_differ_in_their_optimizer_not_in_betas() -> None:
    sgd = plan([1e-3] * 3, GROUPS, optimizer="sgd", betas=None, eps=None, momentum=0.0)
    v = contract(plan([1e-3] * 3, GROUPS, momentum=None), sgd)
    assert first(v) == (0, "settings", "optimizer")
    assert v.first is not None and "optimizer: 'adamw' vs 'sgd'" in evidence_text(v.first.evidence)


def test_a_setting_one_side_does_not_say_is_not_compared_and_is_listed() -> None:
    """The None rule: both say -> compared; neither -> equal; one side only -> unsaid."""
    sgd = plan([1e-3] * 3, GROUPS, optimizer="sgd", betas=None, eps=None, momentum=0.9)
    unsaid = plan([1e-3] * 3, GROUPS, optimizer="sgd", betas=None, eps=None, momentum=None)
    v = contract(sgd, unsaid)
    assert v.passed, v.first
    assert v.unsaid == ("momentum (only the baseline says: 0.9)",)
    assert training_dict(v)["unsaid_settings"] == ["momentum (only the baseline says: 0.9)"]
    assert contract(sgd, sgd).unsaid == ()  # neither says betas / eps: equal, nothing listed
    other = contract(sgd, plan([1e-3] * 3, GROUPS, optimizer="sgd", betas=None, eps=None, momentum=0.0))
    assert first(other) == (0, "settings", "momentum")


def test_precision_is_compared_and_autocast_is_not() -> None:
    autocast = plan([1e-3] * 3, GROUPS, precision="bfloat16", autocast=True)
    bf16_params = plan([1e-3] * 3, GROUPS, precision="bfloat16", autocast=False)
    assert contract(autocast, bf16_params).passed
    v = contract(autocast, plan([1e-3] * 3, GROUPS, precision="float32", autocast=False))
    assert first(v) == (0, "settings", "precision")
    # a recorded plan is in its side's settings: their precision check tells it first
    assert v.first is not None and "precision bfloat16 vs float32 (autocast on vs off)" in evidence_text(
        v.first.evidence
    )


def test_different_initial_weights_are_weights() -> None:
    base = RunRecord(scalars=run(), initial_params={"w": {"norm": 1.0}, "b": {"norm": 2.0}})
    cand = RunRecord(scalars=run(), initial_params={"w": {"norm": 1.0}, "b": {"norm": 2.5}})
    v = judge_run(base, cand, {}, default_table())
    assert first(v) == (0, "weights", "b")


def _at(record_id: str, step: int) -> str:
    name, kind, slot, _, call = record_id.split("|")
    return "|".join((name, kind, slot, str(step), call))


def stepped(records: list, step: int) -> list:  # type: ignore[type-arg]
    return [replace(r, step=step, deps=tuple(_at(d, step) for d in r.deps)) for r in records]


def records_run(base_steps: list[list], cand_steps: list[list]):  # type: ignore[no-untyped-def,type-arg]
    manifest = {"record_mode": "stats"}
    b = Trace(manifest, tuple(r for s, rs in enumerate(base_steps) for r in stepped(rs, s)))
    c = Trace(manifest, tuple(r for s, rs in enumerate(cand_steps) for r in stepped(rs, s)))
    return step_records(compare_traces(b, c, default_table()))


def test_a_layer_bug_from_step_2_names_the_layer_at_step_2() -> None:
    good = two_layers(1.0, 1.0, 1.0)
    records = records_run([good] * 4, [good, good, two_layers(1.0, 1.0, 2.0), two_layers(1.0, 1.0, 2.0)])
    v = judge_run(RunRecord(), RunRecord(), records, default_table())
    assert first(v) == (2, "forward", "b")
    assert v.first is not None and "its inputs matched, its output did not" in evidence_text(v.first.evidence)
    assert v.steps_compared == 4


def grads(scale: float) -> list:  # type: ignore[type-arg]
    return [
        rec(0, "a", "activation"),
        rec(10, "a.weight", "param_grad", 1.0 * scale),
        rec(11, "a.bias", "param_grad", 0.5 * scale),
    ]


def test_every_grad_scaled_by_one_factor_is_the_grad_reduction_not_a_layer() -> None:
    records = records_run([grads(1.0)] * 2, [grads(1.0), grads(2.0)])
    v = judge_run(RunRecord(), RunRecord(), records, default_table())
    assert first(v) == (1, "grad_reduction", "grads")
    assert v.first is not None and "every grad scaled by one factor (x2)" in pattern_text(v.first.pattern)


def backward_grads(a_weight: float, b_weight: float, b_bias: float = 0.5) -> list:  # type: ignore[type-arg]
    """Two modules' activation grads (always the same) and their parameters' grads."""
    return [
        rec(0, "a", "activation"),
        rec(1, "a", "grad_output"),
        rec(2, "b", "grad_output"),
        rec(10, "a.weight", "param_grad", a_weight),
        rec(11, "b.weight", "param_grad", b_weight),
        rec(12, "b.bias", "param_grad", b_bias),
    ]


def test_param_grads_of_several_modules_off_after_a_matching_backward_are_their_reduction() -> None:
    # bf16 accumulation: the backward's activation grads match, the grads the optimizer is
    # given differ (by no single factor) in more than one module.
    records = records_run([backward_grads(1.0, 1.0)], [backward_grads(1.01, 0.99)])
    v = judge_run(RunRecord(), RunRecord(), records, default_table())
    assert first(v) == (0, "grad_reduction", "grads")
    assert v.first is not None and "every activation grad of the backward matched" in evidence_text(
        v.first.evidence
    )
    assert "after the backward" in pattern_text(v.first.pattern)


def test_one_modules_param_grads_off_stay_that_modules_backward() -> None:
    records = records_run([backward_grads(1.0, 1.0)], [backward_grads(1.0, 1.2, 0.6)])
    v = judge_run(RunRecord(), RunRecord(), records, default_table())
    assert first(v)[:2] == (0, "backward") and first(v)[2].startswith("b")


def test_grads_changed_where_only_the_baseline_clipped_is_clipping_before_accumulation() -> None:
    records = records_run([backward_grads(1.0, 1.0)], [backward_grads(0.9, 0.8)])
    base, cand = run(clip_coef=lambda s: 0.4), run(grad_norm=lambda s: 1.5)
    v = judge_run(RunRecord(scalars=base), RunRecord(scalars=cand), records, default_table())
    assert first(v) == (0, "clipping", "clip_coef")
    assert v.first is not None and "clipped each micro-batch's grads before accumulating" in pattern_text(
        v.first.pattern
    )


def test_a_grad_norm_off_while_every_recorded_grad_matched_is_clippings_norm() -> None:
    # The norm over one param group only: every grad matches, the norm the optimizer measured does not.
    records = records_run([backward_grads(1.0, 1.0)], [backward_grads(1.0, 1.0)])
    v = judge_run(
        RunRecord(scalars=run()),
        RunRecord(scalars=run(grad_norm=lambda s: 1.9 - 0.1 * s)),
        records,
        default_table(),
    )
    assert first(v) == (0, "clipping", "grad_norm")
    assert v.first is not None and "all 3 recorded parameter grads matched" in evidence_text(v.first.evidence)
    # without records of the grads the grad norm stays a backward difference
    assert first(judge(run(), run(grad_norm=lambda s: 1.9 - 0.1 * s)))[1] == "backward"


def test_modules_called_twice_as_often_are_a_micro_batch_split() -> None:
    once = [rec(0, "a", "activation")]
    twice = [rec(0, "a", "activation"), rec(1, "a", "activation", call=1)]
    v = judge_run(RunRecord(), RunRecord(), records_run([once], [twice]), default_table())
    assert first(v) == (0, "settings", "micro_batches")


def test_an_expected_run_divergence_passes_only_when_found_exactly() -> None:
    from pytest_precalign.verdict.training_run import owning_phase, with_expectation

    v = judge(run(), run(loss=lambda s: 5.6 - 0.01 * s + (1e-3 if s >= 5 else 0.0)))
    assert with_expectation(v, 5, "loss").passed
    assert with_expectation(v, 5, "loss", "loss").passed
    for wrong in (with_expectation(v, 4, "loss"), with_expectation(v, 5, "forward")):
        assert not wrong.passed
    missed = with_expectation(judge(run(), run()), 5, "optimizer_update")
    assert not missed.passed and owning_phase(missed, ("forward", "backward", "step")) == "step"


def test_no_loss_scaler_is_a_scale_of_1_and_a_loop_that_never_skips_did_not_skip() -> None:
    megatron = run(loss_scale=lambda s: 1.0, skipped=lambda s: False)
    assert judge(megatron, run()).passed
    assert not judge(run(loss_scale=lambda s: 4096.0), run()).passed


def test_the_contract_pairs_megatron_parameters_with_hf_ones_through_the_preset() -> None:
    from pathlib import Path

    import pytest_precalign
    from pytest_precalign.mapping.spec import baseline_param_names, read_mapping_file

    preset = Path(pytest_precalign.__file__).parent / "presets" / "megatron-qwen2.5.yaml"
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64}
    mapping = read_mapping_file(preset, "preset", heads)
    hf = [
        ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
         "model.layers.0.self_attn.v_proj.weight", "lm_head.weight"],
        ["model.layers.0.self_attn.q_proj.bias", "model.norm.weight"],
    ]  # fmt: skip
    meg = [["decoder.layers.0.self_attention.linear_qkv.weight", "output_layer.weight", "decoder.final_layernorm.weight"],
           ["decoder.layers.0.self_attention.linear_qkv.bias"]]  # fmt: skip
    base, cand = plan([1e-3] * 3, hf), plan([1e-3] * 3, meg)
    v = judge_run(
        RunRecord(planned(base), run()),
        RunRecord(planned(cand), run()),
        {},
        default_table(),
        lambda n: baseline_param_names(mapping, n),
    )
    assert first(v) == (0, "settings", "weight_decay")
    assert v.first is not None and "weight_decay of model.norm.weight: 0 vs 0.01" in evidence_text(
        v.first.evidence
    )
    meg[0].remove("decoder.final_layernorm.weight")
    meg[1].append("decoder.final_layernorm.weight")
    v = judge_run(RunRecord(planned(base), run()), RunRecord(planned(plan([1e-3] * 3, meg)), run()), {}, default_table(),
                  lambda n: baseline_param_names(mapping, n))  # fmt: skip
    assert v.passed, v.first


def test_a_fused_parameter_is_not_compared_with_its_parts_initial_norms() -> None:
    base = RunRecord(
        scalars=run(), initial_params={"q": {"norm": 1.0}, "k": {"norm": 1.0}, "o": {"norm": 2.0}}
    )
    cand = RunRecord(scalars=run(), initial_params={"qk": {"norm": 2**0.5}, "o": {"norm": 2.0}})
    fused = {"qk": ("q", "k")}
    v = judge_run(base, cand, {}, default_table(), lambda n: fused.get(n, (n,)))
    assert v.passed, v.first
    cand = RunRecord(scalars=run(), initial_params={"qk": {"norm": 2**0.5}, "o": {"norm": 2.5}})
    assert first(judge_run(base, cand, {}, default_table(), lambda n: fused.get(n, (n,)))) == (
        0,
        "weights",
        "o",
    )


def loss_backward(head_grad: float, loss: float = 1.0, with_loss: bool = True) -> list:  # type: ignore[type-arg]
    """body then head, the loss made from head's output by code outside any module; the
    backward starts with the grad w.r.t. head's output."""
    records = [
        rec(0, "body", "input"),
        rec(1, "body", "activation", deps=(rid("body", "input"),)),
        rec(2, "head", "input"),
        rec(3, "head", "activation", deps=(rid("head", "input"),)),
        rec(4, "loss", "loss", loss),
        rec(10, "head", "grad_output", head_grad),
        rec(11, "head", "grad_input", head_grad, deps=(rid("head", "grad_output"),)),
        rec(12, "body", "grad_output", head_grad),
    ]
    return records if with_loss else [r for r in records if r.kind != "loss"]


def test_a_loss_that_matched_while_its_grad_did_not_is_the_loss() -> None:
    # IPO on summed log-probs (trl PR #1265): policy = reference at step 0, so the loss value
    # coincides on both sides; its grad w.r.t. the head's output does not.
    records = records_run([loss_backward(1.0)], [loss_backward(3.0)])
    v = judge_run(RunRecord(), RunRecord(), records, default_table())
    assert first(v) == (0, "loss", "loss")
    assert v.first is not None and "the loss matched (1 loss record(s) of the step)" in evidence_text(
        v.first.evidence
    )
    assert "its grad w.r.t. head's output" in evidence_text(v.first.evidence)


def test_a_grad_made_inside_a_module_or_without_a_loss_record_stays_the_backward() -> None:
    # No loss compared: nothing says the loss matched, the backward is all the records show.
    no_loss = records_run([loss_backward(1.0, with_loss=False)], [loss_backward(3.0, with_loss=False)])
    assert first(judge_run(RunRecord(), RunRecord(), no_loss, default_table()))[:2] == (0, "backward")
    # The loss itself differs: that is the loss, by its value.
    both = records_run([loss_backward(1.0)], [loss_backward(3.0, loss=2.0)])
    v = judge_run(RunRecord(), RunRecord(), both, default_table())
    assert (
        first(v) == (0, "loss", "loss")
        and v.first is not None
        and "the loss differs" in evidence_text(v.first.evidence)
    )


def test_a_grad_recorded_on_one_side_only_is_the_backward_naming_the_parameter() -> None:
    # Reentrant checkpointing with frozen inputs (transformers #21381): the adapters inside the
    # checkpointed layers get no grad on the candidate, the head outside them still does and
    # matches; the grad norm differs. Before: "clipping ... all recorded grads matched".
    frozen = [r for r in backward_grads(1.0, 1.0) if r.name != "a.weight"]
    records = records_run([backward_grads(1.0, 1.0)], [frozen])
    v = judge_run(
        RunRecord(scalars=run()),
        RunRecord(scalars=run(grad_norm=lambda s: 1.9 - 0.1 * s)),
        records,
        default_table(),
    )
    assert first(v) == (0, "backward", "a.weight")
    assert v.first is not None and not v.passed
    assert (
        "1 parameter(s) got a grad at step 0 on one side only (1 on the baseline): a.weight"
        in evidence_text(v.first.evidence)
    )
    # the same grads on both sides: the grad norm stays clipping's norm
    same = records_run([frozen], [frozen])
    v = judge_run(
        RunRecord(scalars=run()),
        RunRecord(scalars=run(grad_norm=lambda s: 1.9 - 0.1 * s)),
        same,
        default_table(),
    )
    assert first(v) == (0, "clipping", "grad_norm")


def test_a_grad_both_sides_record_at_another_granularity_is_not_one_sided() -> None:
    # HF loop vs Megatron: the baseline records each micro-batch's accumulation (calls 0 and 1,
    # Recorder(param_grads="backward")), the candidate once per step as its optimizer sees it
    # (call 1, param_grads="step"). The parameter has a grad on both sides: call 0 pairs with
    # nothing, the parameter is not one-sided, the verdict does not fail on it.
    per_micro_batch = backward_grads(1.0, 1.0) + [
        replace(r, seq=r.seq + 10, call=1) for r in backward_grads(1.0, 1.0) if r.kind == "param_grad"
    ]
    per_step = [r if r.kind != "param_grad" else replace(r, call=1) for r in backward_grads(1.0, 1.0)]
    records = records_run([per_micro_batch], [per_step])
    assert records[0].grads_one_sided == ()
    v = judge_run(RunRecord(scalars=run()), RunRecord(scalars=run()), records, default_table())
    assert v.passed and v.first is None
    # the same granularity gap with a.weight's grad gone from the candidate: one-sided again
    gone = [r for r in per_step if r.name != "a.weight"]
    assert records_run([per_micro_batch], [gone])[0].grads_one_sided == (("a.weight", "baseline"),)


def forward_only(out: float = 1.0) -> list:  # type: ignore[type-arg]
    """A step's forward records (two layers, the same on both sides unless ``out`` differs)."""
    return two_layers(1.0, 1.0, out)


def _noisy(moved_at: tuple[int, ...]) -> dict[int, StepScalars]:
    """The candidate's scalars: its loss 1e-7 off (within its tolerance) at ``moved_at``, its
    grad norm x1.65 from step 2 (one rank's grads doubled before a 2-rank reduction)."""
    return run(
        loss=lambda s: 5.6 - 0.01 * s + (1e-7 if s in moved_at else 0.0),
        grad_norm=lambda s: (2.0 - 0.1 * s) * (1.65 if s >= 2 else 1.0),
    )


def test_a_grad_norm_off_where_the_layers_clear_the_forward_is_the_backward() -> None:
    # 1 rank vs 2 (DDP): the losses never were bitwise equal (another reduction order); at step
    # 2 every forward record matched and the loss moved only as much: the forward is cleared.
    records = records_run([forward_only()] * 3, [forward_only()] * 3)
    v = judge_run(RunRecord(scalars=run()), RunRecord(scalars=_noisy((0, 2))), records, default_table())
    assert first(v) == (2, "backward", "grad_norm")
    assert (
        v.first is not None
        and "while every forward record of step 2 matched (4 compared)" in evidence_text(v.first.evidence)
    )
    assert "as the sides' losses have since step 0" in evidence_text(v.first.evidence)


def test_the_loss_moving_still_keeps_the_forward_where_no_layer_or_no_earlier_move_clears_it() -> None:
    # scalars only: nothing clears the forward (issue #46)
    assert first(judge(run(), _noisy((0, 2))))[:2] == (2, "forward_or_backward")
    records = records_run([forward_only()] * 3, [forward_only()] * 3)
    # a rerun bitwise until step 2: the loss's first move is evidence against the forward,
    # whatever the layers' tolerance let through
    bitwise = judge_run(RunRecord(scalars=run()), RunRecord(scalars=_noisy((2,))), records, default_table())
    assert first(bitwise)[:2] == (2, "forward_or_backward")
    # a forward record that failed is the forward, not the backward
    faulty = records_run([forward_only()] * 3, [forward_only(), forward_only(), forward_only(2.0)])
    assert first(
        judge_run(RunRecord(scalars=run()), RunRecord(scalars=_noisy((0, 2))), faulty, default_table())
    ) == (
        2,
        "forward",
        "b",
    )


def test_a_grad_norm_off_with_the_forward_and_every_grad_matched_is_clippings_norm() -> None:
    steps = [[*forward_only(), *backward_grads(1.0, 1.0)]] * 3
    v = judge_run(
        RunRecord(scalars=run()),
        RunRecord(scalars=_noisy((0, 2))),
        records_run(steps, steps),
        default_table(),
    )
    assert first(v) == (2, "clipping", "grad_norm")
    assert v.first is not None and "all 3 recorded parameter grads matched" in evidence_text(v.first.evidence)


def _rows_run(rows: dict[int, int], joined: bool) -> dict[int, StepScalars]:
    """A run whose step k trained the rows ``rows[k]`` stands for (as a multiset hash); a DP
    run's batch hash is its replicas' (``dp-replicas:...``), never equal to one process's."""
    digest = (lambda s: f"dp-replicas:{s:016x},{s + 1:016x}") if joined else (lambda s: f"{s:064x}")
    return run(batch_hash=digest, rows_hash=lambda s: f"{rows.get(s, s):064x}")


def test_a_dp_run_that_trained_other_rows_than_one_process_is_data_at_that_step() -> None:
    same = judge(_rows_run({}, joined=False), _rows_run({}, joined=True))
    assert same.passed, same.first  # the same rows (any rank split and order): aligned
    # each rank shuffled its rows: step 1 holds other rows of the dataset
    v = judge(_rows_run({}, joined=False), _rows_run({1: 99}, joined=True))
    assert first(v) == (1, "data", "rows")
    assert v.first is not None and "the candidate's DP replicas' rows joined" in evidence_text(
        v.first.evidence
    )
    # a side recorded before rows hashes existed: not compared, no finding
    older = {s: replace(x, rows_hash=None) for s, x in _rows_run({1: 99}, joined=True).items()}
    assert judge(_rows_run({}, joined=False), older).passed


def test_two_dp_runs_whose_replicas_trained_other_rows_name_the_replica() -> None:
    base = run(batch_hash=lambda s: f"dp-replicas:{'a' * 16},{'b' * 16}")
    cand = run(batch_hash=lambda s: f"dp-replicas:{'a' * 16},{('c' if s == 2 else 'b') * 16}")
    v = judge(base, cand)
    assert first(v) == (2, "data", "batch")
    assert v.first is not None and evidence_text(v.first.evidence).endswith(
        "(DP replica 1: sha256 bbbbbbbbbbbb vs cccccccccccc)"
    )
