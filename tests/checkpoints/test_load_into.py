"""``weights: {load:}`` loading, strictly: a tied HF model loads its own ``save_pretrained``
folder (the tied lm_head is not a missing tensor), into a bf16 model too (cast on copy);
what does not fit is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.checkpoints.load_into import load_into
from pytest_precalign.errors import SourceError


def _tied(seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def test_tied_model_loads_its_folder_and_casts(tmp_path: Path) -> None:
    saved = _tied(3)
    saved.save_pretrained(tmp_path / "ck")
    model = _tied(0)
    assert not torch.equal(model.model.embed_tokens.weight, saved.model.embed_tokens.weight)
    loaded = load_into(model, tmp_path / "ck", "hf", "models.m.weights")
    assert loaded == len(saved.state_dict()) - 1  # lm_head.weight is tied: not in the folder
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), saved.state_dict().values(), strict=True)
    )
    assert model.lm_head.weight is model.model.embed_tokens.weight
    half = _tied(0).to(torch.bfloat16)
    load_into(half, tmp_path / "ck", "hf", "models.m.weights")
    assert half.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(half.model.norm.weight, saved.model.norm.weight.to(torch.bfloat16))


def test_a_checkpoint_that_does_not_fit_is_named(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = _tied(0)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state.pop("model.norm.weight")
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    state["model.extra.bias"] = torch.zeros(2)
    (tmp_path / "ck").mkdir()
    save_file(state, str(tmp_path / "ck" / "model.safetensors"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SourceError) as err:
        load_into(model, tmp_path / "ck", "hf", "models.m.weights")
    assert str(err.value) == (
        f"models.m.weights: {tmp_path / 'ck'} (format hf) does not fit the model: "
        "1 model tensor(s) not in the checkpoint: model.norm.weight; "
        "1 checkpoint tensor(s) the model has no place for: model.extra.bias; "
        "1 shape mismatch(es): model.layers.0.mlp.up_proj.weight [3, 3] (model [24, 16])"
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing half-loaded
