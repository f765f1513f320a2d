"""Tensor parallelism on the Megatron side: TP=2 ranks launched under torchrun on the CPU
(gloo), their traces gathered to the TP=1 layout and compared with Hugging Face and with a TP=1
Megatron run.

Real torch, megatron-core, torchrun and transformers; one launched run is shared by the module.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

from pytest_precalign.checkpoints.sharding import gather_tensor, rule_for_param  # noqa: E402
from pytest_precalign.config.loader import load_config  # noqa: E402
from pytest_precalign.config.specs import AlignConfig  # noqa: E402
from pytest_precalign.errors import CaseError  # noqa: E402
from pytest_precalign.mapping.weights import sync_weights  # noqa: E402
from pytest_precalign.parallel.rules import MEGATRON_GPT_RULES, rule_for
from pytest_precalign.recording.determinism import deterministic  # noqa: E402
from pytest_precalign.run.launch import launch_ranks, merge_launched  # noqa: E402
from pytest_precalign.run.outcome import CaseRun, FinishInputs, finish  # noqa: E402
from pytest_precalign.run.side import run_side  # noqa: E402
from pytest_precalign.run.tensor_parallel import shard_state
from pytest_precalign.sources import build_model, runtime  # noqa: E402
from pytest_precalign.sources.inputs import build_inputs  # noqa: E402
from pytest_precalign.trace.native_io import read_trace  # noqa: E402
from pytest_precalign.trace.records import Trace  # noqa: E402
from tests.helpers.wrong_rules import WRONG_FC1_RULES  # noqa: E402

CONFIG = """
version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  hf:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: &qwen
      vocab_size: 1000
      hidden_size: 64
      intermediate_size: 128
      num_hidden_layers: 2
      num_attention_heads: 4
      num_key_value_heads: 2
      rms_norm_eps: 1.0e-6
      rope_theta: 1000000.0
      max_position_embeddings: 128
      tie_word_embeddings: false
  megatron: {source: megatron, preset: qwen2.5, config: *qwen}
  megatron_tp2: {source: megatron, preset: qwen2.5, tensor_parallel: 2, config: *qwen}
inputs:
  tokens: {kind: tokens, batch: 2, seq_len: 16, vocab_size: 1000, seed: 1, labels: true}
tolerances:
  tp:
    - {match: "*", phase: forward, step: 0, atol: 1.0e-5, rtol: 0,
       why: "RowParallel sums split-K partial products in another order (measured ~1e-6)"}
    - {match: "*", phase: backward, step: 0, atol: 1.0e-6, rtol: 1.0e-5, why: "grads (measured <= 1e-7)"}
    - {match: "*", atol: 2.0e-5, rtol: 1.0e-4,
       why: "after an AdamW step: m/sqrt(v) amplifies 1e-8 differences of near-zero grads"}
cases:
  - name: tp2
    baseline: hf
    candidate: megatron_tp2
    inputs: tokens
    mapping: "preset:megatron-qwen2.5"
    phases: [forward, backward, step]
    steps: 1
    optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01}
    record: {mode: tensor}
    tolerances: tp
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> AlignConfig:
    path = tmp_path_factory.mktemp("tp") / "align.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    return load_config(CONFIG, path)


@pytest.fixture(scope="module")
def runs(config: AlignConfig, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """HF, TP=1 Megatron (weights synced from HF) and the TP=2 ranks, recorded once."""
    case = config.case("tp2")
    hf_spec, mc_spec = config.models["hf"], config.models["megatron"]
    inputs = build_inputs(config.inputs["tokens"], config.base_dir)
    with deterministic(True):
        hf = build_model(hf_spec, config.base_dir)
        with runtime(mc_spec):
            tp1 = build_model(mc_spec, config.base_dir)
            sync_weights(hf.module, tp1.module, case.mapping, strict=True)
            full = {n: p.detach().clone() for n, p in tp1.module.named_parameters()}
            tp1_trace = run_side(tp1, inputs, case, {"side": "tp1"}, 0)
        hf_trace = run_side(hf, inputs, case, {"side": "baseline"}, 0)
        work = tmp_path_factory.mktemp("tp2-ranks")
        out = launch_ranks(config.models["megatron_tp2"], config.base_dir, case, inputs, full, 0, work)
    ranks = [read_trace(out / "step0" / f"rank{r}") for r in range(2)]
    return {
        "case": case,
        "inputs": inputs,
        "full": full,
        "hf": hf_trace,
        "tp1": tp1_trace,
        "ranks": ranks,
        "out": out,
    }


def _finish(config: AlignConfig, base: Trace, cand: Trace, *, mapped: bool = True) -> CaseRun:
    case = config.case("tp2")
    mapping = case.mapping if mapped else None
    return finish(
        FinishInputs(
            name=case.name,
            phases=case.phases,
            baseline=base,
            candidate=cand,
            table=config.tolerances["tp"],
            started=0.0,
            mapping=mapping,
            case=case,
        )  # fmt: skip
    )


def _max_diff(run: CaseRun, kinds: tuple[str, ...], step: int = 0) -> float:
    worst = 0.0
    for pair in run.comparison.pairs:
        rec = pair.record
        if pair.paired and rec.kind in kinds and rec.step == step and pair.candidate is not None:
            a, b = run.baseline.tensor(pair.record), run.candidate.tensor(pair.candidate)
            if a is not None and b is not None and a.numel():
                worst = max(worst, float((a.double() - b.double()).abs().max()))
    return worst


# -- sharding ---------------------------------------------------------------------------------
def test_shard_state_then_gather_is_bitwise_identity(config: AlignConfig) -> None:
    spec = config.models["megatron"]
    with runtime(spec):
        model = build_model(spec, config.base_dir).module
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    shards = [shard_state(full, 2, rank) for rank in range(2)]
    assert shards[0]["decoder.layers.0.mlp.linear_fc1.weight"].shape == (128, 64)
    assert shards[1]["decoder.layers.0.self_attention.linear_qkv.bias"].shape == (64,)
    assert shards[0]["decoder.layers.0.self_attention.linear_proj.weight"].shape == (64, 32)
    assert shards[1]["output_layer.weight"].shape == (500, 64)
    # fc1 per rank is [gate_r; up_r]: rank 1's second half is the second half of up.
    fc1 = full["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(shards[1]["decoder.layers.0.mlp.linear_fc1.weight"][64:], fc1[192:])

    def gathered(name: str, rules: Any = MEGATRON_GPT_RULES) -> torch.Tensor:
        rule = rule_for_param(name, tuple(full[name].shape), rules)
        layout, dim = (rule.layout, rule.dim) if rule is not None else ("replicated", 0)
        return gather_tensor([s[name] for s in shards], layout, dim)

    for name, tensor in full.items():
        assert torch.equal(gathered(name), tensor), name
    # A plain concatenation of fc1 is not the TP=1 layout.
    assert not torch.equal(gathered("decoder.layers.0.mlp.linear_fc1.weight", WRONG_FC1_RULES), fc1)


def test_rules_cover_the_sharded_records(runs: dict[str, Any]) -> None:
    """Every record whose shape differs from TP=1 on a rank has a sharding rule."""
    tp1 = runs["tp1"].by_id()
    for rec in runs["ranks"][0].records:
        if rec.shape != tp1[rec.id].shape:
            assert rule_for(rec, MEGATRON_GPT_RULES) is not None, rec.id


# -- end to end -------------------------------------------------------------------------------
def test_tp2_matches_hf_through_the_preset_mapping(config: AlignConfig, runs: dict[str, Any]) -> None:
    gathered = merge_launched(runs["out"], {"side": "candidate"})
    merge = gathered.manifest["parallel_merge"]
    assert merge["world_size"] == 2 and merge["layout"].startswith("tp=2, pp=1")
    assert "replica_mismatches" not in gathered.manifest and merge["replicas_checked"] > 100
    run = _finish(config, runs["hf"], gathered)
    for phase, verdict in run.verdicts.items():
        assert verdict.passed and verdict.aligned, (phase, verdict.failures[:3])
        assert verdict.compared > (20 if phase == "step" else 50)
        # Only what the mapping's `unmatched` rules explain lacks a counterpart.
        unexplained = [
            p.record.id
            for p in run.comparison.by_phase(phase)
            if p.status in ("only_baseline", "only_candidate") and p.record.kind != "input" and not p.note
        ]
        assert unexplained == [], unexplained[:5]
    # fp32 forward within 1e-5 (measured 9.5e-7), grads within 1e-6 (measured 5.6e-8), the
    # weights after one AdamW step within 2e-5 (measured 4.9e-6: m/sqrt(v) amplifies tiny
    # grad differences; a forward on those weights differs by up to ~3e-5, so one step only).
    assert _max_diff(run, ("activation", "logits", "loss")) <= 1e-5
    assert _max_diff(run, ("grad_output", "grad_input", "param_grad")) <= 1e-6
    assert _max_diff(run, ("param",)) <= 2e-5


def test_tp2_matches_tp1_megatron_without_a_mapping(config: AlignConfig, runs: dict[str, Any]) -> None:
    gathered = merge_launched(runs["out"], {})
    tp1: Trace = runs["tp1"]

    # The same records as TP=1, in its order, except that the ranks record param grads once
    # the backward is over and finalize_model_grads has reduced them (as the optimizer sees
    # them), where the in-process side records each as the backward accumulates it.
    def ids(trace: Trace, param_grads: bool) -> list[tuple[str, tuple[int, ...]]]:
        return [(r.id, r.shape) for r in trace.records if (r.kind == "param_grad") == param_grads]

    assert ids(gathered, False) == ids(tp1, False)
    assert sorted(ids(gathered, True)) == sorted(ids(tp1, True)) != []
    run = _finish(config, tp1, gathered, mapped=False)
    assert all(v.passed and v.aligned for v in run.verdicts.values())
    assert all(p.paired for p in run.comparison.pairs)


def test_wrong_fc1_gather_is_caught_at_layer0_fc1(config: AlignConfig, runs: dict[str, Any]) -> None:
    wrong = merge_launched(runs["out"], {}, rules=WRONG_FC1_RULES)
    case = replace(config.case("tp2"), phases=("forward",))
    job = FinishInputs(
        name=case.name, phases=case.phases, baseline=runs["hf"], candidate=wrong, table=config.tolerances["tp"],
        started=0.0, mapping=case.mapping, case=case,
    )  # fmt: skip
    verdict = finish(job).verdicts["forward"]
    assert not verdict.passed
    assert verdict.first is not None
    assert verdict.first.name in ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")
    assert verdict.first.kind == "activation"


def test_a_failing_rank_surfaces_as_one_case_error(
    config: AlignConfig, runs: dict[str, Any], tmp_path: Path
) -> None:
    full = dict(runs["full"])
    del full["decoder.final_layernorm.weight"]
    with pytest.raises(CaseError, match=r"rank [01] failed: CaseError: rank [01]: .*final_layernorm"):
        launch_ranks(
            config.models["megatron_tp2"],
            config.base_dir,
            config.case("tp2"),
            runs["inputs"],
            full,
            0,
            tmp_path,
            timeout=120,
        )


def test_stats_mode_is_refused_before_launching(
    config: AlignConfig, runs: dict[str, Any], tmp_path: Path
) -> None:
    case = config.case("tp2")
    case = replace(case, record=replace(case.record, mode="stats"))
    with pytest.raises(CaseError, match=r"record: \{mode: tensor\}"):
        launch_ranks(config.models["megatron_tp2"], Path("."), case, runs["inputs"], None, 0, tmp_path)
    assert not (tmp_path / "torchrun.pid").exists()
