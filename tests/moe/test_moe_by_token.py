"""MoE compared for what it means (issue 14 item 2): a real Hugging Face ``Qwen2MoeForCausalLM``
(tiny, fixed seed) whose fused experts (transformers 5.x holds them as 3D parameters, with no
module per expert) are unfused into one ``nn.Module`` per expert, so that each expert's calls are
recordable. The baseline dispatches like Hugging Face (a loop over experts, ``torch.where`` token
subsets, in (top-k slot, token) order); the candidate like Megatron's token dispatcher (tokens
sorted by expert id, experts called on contiguous slices, the results un-permuted). Both are
correct: keyed by token they align; paired positionally (``record.moe`` not set, as on main) they
fail at an expert. A bug in expert 2 of the candidate is named at that expert."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config_file
from pytest_precalign.run.case import run_case

NETS = """
import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM


class Expert(torch.nn.Module):
    def __init__(self, hidden, inner, scale):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.down_proj = torch.nn.Linear(inner, hidden, bias=False)
        self.act_fn = torch.nn.SiLU()
        self.scale = scale  # 1.0, or a planted bug

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)) * self.scale


class PerExpert(torch.nn.ModuleList):
    \"\"\"Qwen2MoeExperts' computation with one module per expert and a choice of dispatcher.\"\"\"

    def __init__(self, fused, dispatch, bug_expert, reroute):
        n, two_inner, hidden = fused.gate_up_proj.shape
        inner = two_inner // 2
        super().__init__(Expert(hidden, inner, 1.001 if e == bug_expert else 1.0) for e in range(n))
        with torch.no_grad():
            for e, expert in enumerate(self):
                gate, up = fused.gate_up_proj[e].chunk(2, dim=0)
                expert.gate_proj.weight.copy_(gate)
                expert.up_proj.weight.copy_(up)
                expert.down_proj.weight.copy_(fused.down_proj[e])
        self.dispatch = dispatch
        self.reroute = reroute

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        if self.reroute:  # a routing bug: token 0's second choice goes to an expert it did not pick
            top_k_index = top_k_index.clone()
            free = [e for e in range(len(self)) if e not in top_k_index[0].tolist()]
            top_k_index[0, 1] = free[0]
        if self.dispatch == "loop":  # Hugging Face: per expert, its (slot, token) pairs
            for e, expert in enumerate(self):
                pos, tok = torch.where((top_k_index == e).T)
                if tok.numel():
                    out = expert(hidden_states[tok]) * top_k_weights[tok, pos, None]
                    final.index_add_(0, tok, out)
            return final
        # Megatron-like: permute tokens by expert id, contiguous slices, un-permute
        k = top_k_index.shape[1]
        order = torch.argsort(top_k_index.reshape(-1), stable=True)
        tok, pos = order // k, order % k
        counts = torch.bincount(top_k_index.reshape(-1), minlength=len(self)).tolist()
        permuted = hidden_states[tok]
        outs, start = [], 0
        for e, expert in enumerate(self):
            if counts[e]:
                outs.append(expert(permuted[start : start + counts[e]]))
            start += counts[e]
        y = torch.cat(outs) * top_k_weights[tok, pos, None]
        final.index_add_(0, tok, y)
        return final


def build(dispatch="loop", bug_expert=-1, reroute=False):
    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
    )
    model = Qwen2MoeForCausalLM(config).float()
    for layer in model.model.layers:
        layer.mlp.experts = PerExpert(layer.mlp.experts, dispatch, bug_expert, reroute)
    return model
"""

CONFIG = """
version: 1
models:
  hf_loop: {source: factory, factory: "moe_nets:build", kwargs: {dispatch: loop}}
  sorted: {source: factory, factory: "moe_nets:build", kwargs: {dispatch: sort}}
  sorted_bug: {source: factory, factory: "moe_nets:build", kwargs: {dispatch: sort, bug_expert: 2}}
  rerouted: {source: factory, factory: "moe_nets:build", kwargs: {dispatch: sort, reroute: true}}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 6, vocab_size: 64, labels: true}
tolerances:
  fp32:
    - {match: "*", atol: 1.0e-7, rtol: 1.0e-5, why: "fp32, summation order of the un-permute differs"}
cases:
  - {name: by_token, baseline: hf_loop, candidate: sorted, inputs: toks, phases: [forward, backward],
     record: {mode: tensor, moe: {block: "model.layers.*.mlp", experts: "experts.*"}}, tolerances: fp32}
  - {name: positional, baseline: hf_loop, candidate: sorted, inputs: toks, phases: [forward],
     record: {mode: tensor}, tolerances: fp32}
  - {name: expert_bug, baseline: hf_loop, candidate: sorted_bug, inputs: toks, phases: [forward, backward],
     record: {mode: tensor, moe: {block: "model.layers.*.mlp", experts: "experts.*"}}, tolerances: fp32}
  - {name: rerouted, baseline: hf_loop, candidate: rerouted, inputs: toks, phases: [forward],
     record: {mode: tensor, moe: {block: "model.layers.*.mlp", experts: "experts.*"}}, tolerances: fp32}
"""


@pytest.fixture
def suite(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "moe_nets.py").write_text(NETS, encoding="utf-8")
    (tmp_path / "align.yaml").write_text(CONFIG, encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("moe_nets", None)


def _first(run: object) -> dict[str, str]:
    verdicts = run.verdicts  # type: ignore[attr-defined]
    return {phase: v.first.name for phase, v in verdicts.items() if v.first is not None}


def test_two_correct_dispatchers_align_when_experts_are_keyed_by_token(suite: Path) -> None:
    config = load_config_file(suite / "align.yaml")
    run = run_case(config, config.case("by_token"))
    assert _first(run) == {}
    assert all(v.passed for v in run.verdicts.values())
    names = {p.record.name for p in run.comparison.pairs if p.paired}
    # The experts and the routing were compared, not skipped.
    assert "model.layers.0.mlp.experts.2" in names
    assert "model.layers.1.mlp.routing" in names
    assert "model.layers.0.mlp.experts.3.down_proj" in names


def test_paired_positionally_the_same_dispatchers_fail_at_an_expert(suite: Path) -> None:
    """What main does (no ``record.moe``): the reordering is reported as a divergence."""
    config = load_config_file(suite / "align.yaml")
    run = run_case(config, config.case("positional"))
    first = _first(run)
    assert ".mlp.experts." in first["forward"], first
    # ... while the MoE block's output matches.
    block = [p for p in run.comparison.pairs if p.record.id == _out_id("model.layers.0.mlp")]
    assert block and block[0].passed


def test_a_bug_in_one_expert_is_named_at_that_expert(suite: Path) -> None:
    config = load_config_file(suite / "align.yaml")
    run = run_case(config, config.case("expert_bug"))
    first = run.verdicts["forward"].first
    assert first is not None
    assert (first.name, first.kind) == ("model.layers.0.mlp.experts.2", "activation")
    # The origin: its inputs (the same tokens' rows) matched.
    assert first.origin and first.proven
    forward = run.comparison.by_phase("forward")
    failing = {p.record.name for p in forward if p.paired and not p.passed}
    layer0 = {n for n in failing if n.startswith("model.layers.0.mlp.experts.")}
    assert layer0 == {"model.layers.0.mlp.experts.2"}, layer0


def test_a_token_routed_differently_fails_the_routing_and_its_expert_rows_are_unmatched(
    suite: Path,
) -> None:
    config = load_config_file(suite / "align.yaml")
    run = run_case(config, config.case("rerouted"))
    verdict = run.verdicts["forward"]
    assert not verdict.passed
    routing = [p for p in run.comparison.pairs if p.record.name == "model.layers.0.mlp.routing"]
    assert [(p.status, p.evidence) for p in routing] == [("fail", "hash")]  # exact: one entry moved
    # Token 0's rows are unmatched, each with the reason; the other tokens' rows still pair.
    lone = {rid: why for rid, why in verdict.reasons.items() if "@token0" in rid and "layers.0." in rid}
    assert lone and all("routed differently" in why for why in lone.values()), verdict.reasons
    experts = [p for p in run.comparison.pairs if p.record.name.startswith("model.layers.0.mlp.experts.")]
    assert any(p.paired and p.passed and p.record.kind == "input" for p in experts)


def _out_id(name: str) -> str:
    from pytest_precalign.trace.records import record_id

    return record_id(name, "activation", "out", 0, 0)
