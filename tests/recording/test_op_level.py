"""Op-level recording (record: {level: op|mix}): torch calls inside modules, named like
msprobe's APIs, paired per module, and written as L1/mix msprobe dumps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError
from pytest_precalign.msprobe import read_msprobe_dump, write_msprobe_dump
from pytest_precalign.recording import HookRecorder
from pytest_precalign.run.case import run_case
from tests.helpers.msprobe_cli import msprobe_compare, needs_msprobe

CONFIG = """
version: 1
models:
  eager:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: &c {vocab_size: 1000, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, tie_word_embeddings: false}
  sdpa: {source: hf, class: transformers.Qwen2ForCausalLM, attn_implementation: sdpa, config: *c}
  faulty: {source: hf, class: transformers.Qwen2ForCausalLM, attn_implementation: eager, config: *c,
           patch: "op_level_faults:%(patch)s"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 16, vocab_size: 1000, seed: 5, labels: true}
tolerances:
  t:
    - {match: "*", atol: 1.0e-6, rtol: 1.0e-5, why: "fp32, any dtype"}
cases:
  - {name: c, baseline: eager, candidate: %(candidate)s, inputs: toks, weights: {sync: true},
     phases: [forward, backward], record: {mode: %(mode)s, level: %(level)s}, tolerances: t}
"""

# A user's fault: layer 1's attention computes its softmax in float16.
THEIR_FAULTS = """
import torch

def softmax_fp16(model):
    attn = model.model.layers[1].self_attn
    original = attn.forward

    def forward(*args, **kwargs):
        plain = torch.nn.functional.softmax

        def low(x, dim=None, dtype=None, **kwargs):
            torch.nn.functional.softmax = plain  # F.softmax looks itself up by name
            try:
                return plain(x.to(torch.float16), dim=dim).to(x.dtype)
            finally:
                torch.nn.functional.softmax = low

        torch.nn.functional.softmax = low
        try:
            return original(*args, **kwargs)
        finally:
            torch.nn.functional.softmax = plain

    attn.forward = forward

def none(model):
    pass
"""


def _run(
    tmp_path: Path, level: str, candidate: str = "faulty", patch: str = "softmax_fp16", mode: str = "tensor"
):
    (tmp_path / "op_level_faults.py").write_text(THEIR_FAULTS)
    text = CONFIG % {"candidate": candidate, "patch": patch, "mode": mode, "level": level}
    config = load_config(text, tmp_path / "align.yaml")
    return run_case(config, config.cases[0])


def _ops(trace):
    return [r for r in trace.records if r.module_class == "api"]


def test_op_level_names_the_softmax_in_the_wrong_dtype(tmp_path):
    run = _run(tmp_path, "op")
    first = run.verdicts["forward"].first
    assert first is not None
    # The layer is the module the op ran in; the op (its inputs matched) is the detail.
    assert first.name == "model.layers.1.self_attn"
    assert first.origin is True
    assert first.first_op == "Functional.softmax.0.forward in model.layers.1.self_attn"
    assert first.pair.record.name == "model.layers.1.self_attn.Functional.softmax"
    # Ops only: no module records besides parameter grads, logits and loss.
    kinds = {(r.module_class == "api", r.kind) for r in run.baseline.records}
    assert (False, "activation") not in kinds and (True, "activation") in kinds
    # The extra casts are unmatched with a reason, not failures.
    verdict = run.verdicts["forward"]
    casts = [r for r in verdict.only_candidate if r.name == "model.layers.1.self_attn.Tensor.to"]
    assert casts
    assert all(
        "called 1 times" in verdict.reasons[r.id] and "by the candidate" in verdict.reasons[r.id]
        for r in casts
    )
    assert not any(p.record.name == "model.layers.1.self_attn.Tensor.to" for p in verdict.failures)


def test_mix_level_names_the_layer_and_the_op(tmp_path):
    run = _run(tmp_path, "mix")
    first = run.verdicts["forward"].first
    assert first is not None
    # The first module record that fails is o_proj (fed by the softmax); the code between
    # modules of self_attn is where it entered, and the op names it.
    assert first.name == "model.layers.1.self_attn.o_proj"
    assert first.origin is False and first.origin_module == "model.layers.1.self_attn"
    assert first.first_op == "Functional.softmax.0.forward in model.layers.1.self_attn"
    # Layer 0 is aligned at op level too: its softmax pair passed.
    soft0 = next(
        p for p in run.comparison.pairs if p.record.name == "model.layers.0.self_attn.Functional.softmax"
    )
    assert soft0.passed and soft0.evidence == "tensor"


def test_level_module_records_no_ops(tmp_path):
    run = _run(tmp_path, "module")
    assert _ops(run.baseline) == [] and _ops(run.candidate) == []
    assert "parents" not in run.baseline.manifest
    first = run.verdicts["forward"].first
    assert first is not None and first.first_op is None
    assert first.name == "model.layers.1.self_attn.o_proj"


def test_eager_vs_sdpa_ops_are_unmatched_with_reasons_not_failures(tmp_path):
    run = _run(tmp_path, "mix", candidate="sdpa")
    for phase in ("forward", "backward"):
        verdict = run.verdicts[phase]
        assert verdict.passed, [p.record.id for p in verdict.failures][:5]
    forward = run.verdicts["forward"]
    one_sided = [*forward.only_baseline, *forward.only_candidate]
    names = {r.name for r in one_sided}
    assert "model.layers.0.self_attn.Functional.softmax" in names
    assert "model.layers.0.self_attn.Functional.scaled_dot_product_attention" in names
    assert all(forward.reasons.get(r.id) for r in one_sided if r.module_class == "api")
    sdpa = next(r for r in forward.only_candidate if r.name.endswith("scaled_dot_product_attention"))
    assert forward.reasons[sdpa.id].startswith("op call only in the candidate: the baseline makes no")
    # Ops both sides make the same way are still compared, in layer 1 as in layer 0.
    paired = {p.record.name for p in run.comparison.pairs if p.paired and p.record.module_class == "api"}
    assert "model.layers.1.mlp.Tensor.mul" in paired
    assert "model.layers.1.self_attn.o_proj.Functional.linear" in paired


@pytest.mark.parametrize("level", ["op", "mix"])
def test_op_recording_does_not_change_numerics(tiny_qwen2_config, level):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**tiny_qwen2_config, attn_implementation="eager"))
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1))

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.logits.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters()}

    logits_plain, grads_plain = run()
    with HookRecorder(model, mode="tensor", level=level) as rec:
        logits_rec, grads_rec = run()
    assert torch.equal(logits_plain, logits_rec)
    for name, grad in grads_plain.items():
        assert torch.equal(grad, grads_rec[name]), name
    trace = rec.trace()
    ops = _ops(trace)
    assert {r.kind for r in ops} == {"activation", "grad_output"}
    assert (
        trace.manifest["parents"]["model.layers.0.mlp.act_fn.Functional.silu#0"]
        == "model.layers.0.mlp.act_fn#0"
    )
    # The recorder's own work is not recorded as ops, and the mode is gone afterwards.
    assert not any("aminmax" in r.name or "vector_norm" in r.name for r in ops)
    count = len(trace.records)
    run()
    assert len(rec.trace().records) == count


def test_bad_level_names_file_key_and_allowed_values(tmp_path):
    text = CONFIG % {"candidate": "sdpa", "patch": "none", "mode": "stats", "level": "ops"}
    with pytest.raises(ConfigError) as err:
        load_config(text, tmp_path / "align.yaml")
    message = str(err.value)
    assert "align.yaml" in message
    assert "record.level: unknown value 'ops' (allowed: module, op, mix)" in message


@needs_msprobe
def test_mix_dump_is_accepted_by_msprobe_compare(tmp_path):
    run = _run(tmp_path, "mix", mode="tensor")
    base = write_msprobe_dump(run.baseline, tmp_path / "base").parent
    cand = write_msprobe_dump(run.candidate, tmp_path / "cand").parent
    back = read_msprobe_dump(base)
    assert back.manifest["level"] == "mix"
    soft = [r for r in back.records if r.name == "Functional.softmax" and r.kind == "activation"]
    assert [r.call for r in soft] == [0, 1]  # msprobe's counter runs through the step
    assert back.manifest["parents"]["Functional.softmax#1"] == "model.layers.1.self_attn#0"
    text = msprobe_compare(cand, base, tmp_path / "out")
    assert "Functional.softmax.1.forward.output.0" in text
    assert "Module.model.layers.1.self_attn.o_proj.Linear.forward.0.output.0" in text
