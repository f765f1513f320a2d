"""The Megatron families example suite end to end (presets llama, qwen3, mixtral and qwen3-moe
against their HF classes)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.runs import ExampleSuite, RunPytest

pytest.importorskip("megatron.core")

# forward, backward, 2 steps
ALIGNED = {
    "llama_fp32_train",
    "llama_tied_fp32_train",
    "qwen3_fp32_train",
    "mixtral_fp32_train",
    "qwen3_moe_fp32_train",
}
# forward and backward: bf16, the mapping presets the other way round (Megatron baseline), and
# Qwen3-MoE's router without renormalising its top-k weights
TWO_PHASES = {
    "llama_bf16_forward_backward",
    "qwen3_bf16_forward_backward",
    "qwen3_megatron_as_baseline",
    "mixtral_bf16_forward_backward",
    "qwen3_moe_bf16_forward_backward",
    "mixtral_megatron_as_baseline",
    "qwen3_moe_unnormalised_forward_backward",
}
# Faults planted on the Megatron side (faults.py), by the HF module they are in (a fault in one
# expert: HF's experts are one fused module, so the MoE block that holds it).
KNOWN = {
    "known_llama_mlp_bug": "model.layers.1.mlp",
    "known_qwen3_k_norm_bug": "model.layers.0.self_attn.k_norm",
    "known_mixtral_expert_bug": "model.layers.1.mlp",
    "known_qwen3_moe_expert_bug": "model.layers.0.mlp",
}
MOE = ("mixtral", "qwen3_moe")


def test_family_presets_align_in_training_and_name_planted_faults(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    folder = example_suite("megatron_families")
    # The launched case (2 ranks under torchrun) is the next test's.
    result = run_pytest(
        "--align-config",
        str(folder / "align.yaml"),
        str(folder),
        "--align-report",
        "out",
        "-k",
        "not launched",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 37, result.stdout.str()
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    cases = report["cases"]
    for case in cases:
        # strict sync: every parameter on both sides paired by the preset mapping
        assert case["weights"] == {**case["weights"], "unsynced": [], "unused": []}, case["name"]
        assert case["weights"]["copied"] + case["weights"]["transformed"] > 0
        for side in ("baseline", "candidate"):
            assert all(u["reason"] for u in case["unmatched"][side]), (case["name"], case["unmatched"][side])
    aligned = [c for c in cases if c["name"] in ALIGNED | TWO_PHASES]
    assert {(c["name"], c["phase"]) for c in aligned} == {
        (n, p) for n in ALIGNED for p in ("forward", "backward", "step")
    } | {(n, p) for n in TWO_PHASES for p in ("forward", "backward")}
    assert all(c["first_divergence"] is None and c["compared"] > 0 for c in aligned), aligned
    steps = {c["name"]: c for c in aligned if c["phase"] == "step"}
    assert all(c["compared"] >= 40 for c in steps.values()), steps  # both AdamW steps' weights
    forward = {c["name"]: c for c in cases if c["phase"] == "forward"}
    for name, module in KNOWN.items():
        first = forward[name]["first_divergence"]
        assert (first["name"], first["origin"]) == (module, True), (name, first)
    # MoE: the router and every expert's slice of HF's fused experts synced, and their grads and
    # values after both steps compared (2 layers x (router + gate_up_proj + down_proj))
    for name in ("mixtral_fp32_train", "qwen3_moe_fp32_train"):
        case = next(c for c in cases if c["name"] == name and c["phase"] == "step")
        assert case["weights"]["transformed"] >= 2 * (1 + 2 * 4), case["weights"]
    moe_cases = [c for c in cases if c["name"].startswith(MOE) and c["phase"] == "forward"]
    assert len(moe_cases) == 6
    for case in moe_cases:
        unmatched = {u["name"] for side in ("baseline", "candidate") for u in case["unmatched"][side]}
        experts = {n for n in unmatched if ".local_experts." in n}
        assert len(experts) >= 2 * 4 * 3, (case["name"], sorted(unmatched))  # each expert, fc1, fc2


LAUNCHED = ("llama_fp32_tp2_launched", "qwen3_fp32_tp2_launched", "mixtral_fp32_ep2_launched")
QK_NORM_GRADS = {f"model.layers.{i}.self_attn.{n}_norm.weight" for i in (0, 1) for n in ("q", "k")}


@pytest.mark.slow  # launched 2-rank cases, twice; tox -e slow
def test_launched_presets_align_at_tp2_and_ep2_and_name_a_fault_on_the_second_rank(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    """Megatron Llama (rope scaling llama3, GQA) and Qwen3 (q/k layernorm) at TP=2, and Mixtral
    at expert_parallel 2 (each rank 2 of the 4 experts) under torchrun against HF: forward,
    backward and an AdamW step aligned; a fault in global expert 3 (the second rank's expert 1)
    named at its MoE block. Qwen3's q/k layernorm weight grads are partial sums on each rank
    (its heads) until megatron-core's finalize_model_grads all-reduces them, as Megatron's
    training loop does: compared after it, as the optimizer steps on them (before the fix:
    failed at k_norm.weight)."""
    folder = example_suite("megatron_families")
    result = run_pytest(
        "--align-config", str(folder / "align.yaml"), str(folder), "--align-report", "out", "-k", "launched"
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 10, result.stdout.str()
    cases = json.loads((pytester.path / "out" / "report.json").read_text())["cases"]
    assert {(c["name"], c["phase"]) for c in cases} == {
        (n, p) for n in LAUNCHED for p in ("forward", "backward", "step")
    } | {("known_mixtral_expert_bug_ep2_launched", "forward")}
    aligned = [c for c in cases if c["name"] in LAUNCHED]
    assert all(c["first_divergence"] is None and c["compared"] > 0 for c in aligned), cases
    assert all(c["weights"]["unused"] == [] == c["weights"]["unsynced"] for c in cases)
    by_case = {(c["name"], c["phase"]): c for c in cases}
    grads = {
        r["name"]: r["status"]
        for r in by_case[("qwen3_fp32_tp2_launched", "backward")]["records"]
        if r["kind"] == "param_grad"
    }
    assert {grads.get(name) for name in QK_NORM_GRADS} == {"ok"}, grads
    params = {r["name"] for r in by_case[("qwen3_fp32_tp2_launched", "step")]["records"]}
    assert params >= QK_NORM_GRADS
    # the step compares every expert's weights: both ranks' experts, renamed to global ones
    step = by_case[("mixtral_fp32_ep2_launched", "step")]
    assert step["compared"] == 21 and step["unmatched"] == {"baseline": [], "candidate": []}, step
    fault = next(c for c in cases if c["name"].startswith("known_mixtral"))["first_divergence"]
    assert (fault["name"], fault["origin"]) == ("model.layers.1.mlp", True), fault
