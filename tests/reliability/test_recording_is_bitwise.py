"""A recorded run is bitwise equal to an unrecorded one, for an HF Qwen2 and a megatron-core
GPTModel (CPU, gloo): logits, loss, every parameter gradient, and every parameter after an
AdamW step. Two copies of the same seeded model run the same inputs, one under the recorder.
So are tiny models that modify a module's output or input in place, at every record level."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.determinism import deterministic, seed_everything
from pytest_precalign.run.trainers.case_step import causal_lm_loss
from pytest_precalign.sources import LoadedModel, build_model, runtime
from tests.helpers.inplace_nets import INPLACE_NETS, VANISHED

CONFIG = """
version: 1
models:
  hf: {source: hf, class: transformers.Qwen2ForCausalLM, attn_implementation: eager, config: &c {vocab_size: 500, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64, tie_word_embeddings: false}}
  megatron: {source: megatron, config: *c}
cases: []
"""


def _step(model: LoadedModel, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """forward, loss, backward and one AdamW step; everything the run produces."""
    seed_everything(0)
    optimizer = torch.optim.AdamW(model.module.parameters(), lr=1e-2)
    optimizer.zero_grad(set_to_none=True)
    logits = model.logits(model({"input_ids": ids}))
    loss = causal_lm_loss(logits, ids)
    loss.backward()
    out = {"logits": logits.detach().clone(), "loss": loss.detach().clone()}
    named = list(model.module.named_parameters())
    out.update({f"grad:{n}": p.grad.clone() for n, p in named if p.grad is not None})
    optimizer.step()
    out.update({f"param:{n}": p.detach().clone() for n, p in named})
    return out


@pytest.mark.parametrize("mode", ["stats", "tensor", "hash"])
@pytest.mark.parametrize("source", ["hf", "megatron"])
def test_recorded_run_is_bitwise_equal(tmp_path: Path, source: str, mode: str) -> None:
    if source == "megatron":
        pytest.importorskip("megatron.core")
    config = load_config(CONFIG, tmp_path / "align.yaml")
    spec = config.models[source]
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(7))
    with deterministic(True), runtime(spec):
        plain_model, recorded_model = build_model(spec, tmp_path), build_model(spec, tmp_path)
        plain = _step(plain_model, ids)
        with HookRecorder(recorded_model.module, mode=mode) as rec:
            recorded = _step(recorded_model, ids)
    assert plain.keys() == recorded.keys()
    assert sum(k.startswith("grad:") for k in plain) == len(list(plain_model.module.parameters()))
    differ = [k for k in plain if not torch.equal(plain[k], recorded[k])]
    assert differ == []
    kinds = {r.kind for r in rec.trace().records}
    assert {"activation", "grad_output", "param_grad"} <= kinds  # it did record


@pytest.mark.parametrize("level", ["module", "op", "mix"])
@pytest.mark.parametrize("mode", ["stats", "tensor", "hash"])
@pytest.mark.parametrize("name", sorted(INPLACE_NETS))
def test_recording_a_model_with_inplace_ops_is_bitwise_neutral(name: str, mode: str, level: str) -> None:
    """Views modified in place after a module: their grads are read from the base's autograd
    node (a pre-hook that only reads), and the run stays bit for bit the unrecorded one."""
    net, _ = INPLACE_NETS[name]
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))

    def run(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        out = model(x)
        out.pow(2).mean().backward()
        seen = {"out": out.detach().clone()}
        seen.update({f"grad:{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        optimizer.step()
        seen.update({f"param:{n}": p.detach().clone() for n, p in model.named_parameters()})
        return seen

    plain = run(net())
    model = net()
    with HookRecorder(model, mode=mode, level=level) as rec:
        recorded = run(model)
    assert plain.keys() == recorded.keys() and len(plain) == 1 + 2 * len(list(model.parameters()))
    assert [k for k in plain if not torch.equal(plain[k], recorded[k])] == []
    grads = {(r.name, r.kind) for r in rec.trace().records}
    if level == "op":
        assert any(kind == "grad_output" for _, kind in grads)  # it did record
    else:
        assert VANISHED[name] <= grads
