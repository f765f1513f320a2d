"""msprobe layer_mapping YAML (seed 000 templates) against real module trees."""

from __future__ import annotations

import warnings

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError
from pytest_precalign.mapping.layer_mapping import LayerMapping, parse_layer_mapping, read_layer_mapping
from pytest_precalign.yaml_reader import Reader, load_yaml
from tests.helpers.paths import PRESETS as PRESET_DIR

PRESETS = PRESET_DIR / "layer_mapping"

CONFIG = """
version: 1
models:
  hf: {source: hf, class: transformers.Qwen2ForCausalLM,
       config: &c {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
                   num_attention_heads: 4, num_key_value_heads: 2, tie_word_embeddings: false}}
  mc: {source: megatron, config: *c, dtype: bfloat16}
inputs:
  t: {kind: tokens, vocab_size: 128}
cases:
  - {name: c, baseline: hf, candidate: mc, inputs: t}
"""


class _Wrapper(torch.nn.Module):
    """What a training framework puts around the model (DeepSpeed/DDP expose it as `module`)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def _tree(model: torch.nn.Module) -> dict[str, str]:
    return {name: type(m).__name__ for name, m in model.named_modules() if name}


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """Module trees as msprobe names them: MindSpeed's [DDP(Float16Module(GPTModel))] list,
    and LLaMA-Factory's HF model inside its engine wrapper (both expose `.module`)."""
    pytest.importorskip("megatron.core")
    from pytest_precalign.sources import build_model, runtime

    base = tmp_path_factory.mktemp("lm")
    config = load_config(CONFIG, base / "a.yaml")
    with runtime(config.models["mc"]):
        gpt = build_model(config.models["mc"], base).module
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.transformer.module import Float16Module

            mindspeed = torch.nn.ModuleList([_Wrapper(Float16Module(gpt.config, gpt))])
        hf = _Wrapper(build_model(config.models["hf"], base).module)
        return _tree(mindspeed), _tree(hf)


def test_mindspeed_to_hf_template_maps_onto_the_hf_tree(trees):
    mindspeed, hf = trees
    mapping = read_layer_mapping(PRESETS / "qwen2.5-mindspeed-to-hf.yaml")
    mapped = {name: mapping.to_baseline(name, mindspeed.get) for name in mindspeed}
    expected = {
        "0.module": "module",  # Float16Module <-> the HF model under its engine's `module`
        "0.module.module": "module.model",
        "0.module.module.embedding.word_embeddings": "module.model.embed_tokens",
        "0.module.module.decoder.layers.1.self_attention": "module.model.layers.1.self_attn",
        "0.module.module.decoder.layers.1.self_attention.linear_proj": "module.model.layers.1.self_attn.o_proj",
        "0.module.module.decoder.layers.0.pre_mlp_layernorm": "module.model.layers.0.post_attention_layernorm",
        "0.module.module.decoder.layers.0.input_layernorm": "module.model.layers.0.input_layernorm",
        "0.module.module.decoder.layers.0.mlp.linear_fc2": "module.model.layers.0.mlp.down_proj",
        "0.module.module.decoder.final_layernorm": "module.model.norm",
        "0.module.module.output_layer": "module.lm_head",
    }
    for cand, base in expected.items():
        assert mapped[cand] == base
        assert base in hf
    # Everything the template names lands on a real HF module.
    landed = {m for m in mapped.values() if m in hf}
    assert len(landed) >= 2 + 2 * 6 + 3


def test_hf_to_mindspeed_template_is_the_way_back(trees):
    mindspeed, hf = trees
    forward = read_layer_mapping(PRESETS / "qwen2.5-mindspeed-to-hf.yaml")
    back = read_layer_mapping(PRESETS / "qwen2.5-hf-to-mindspeed.yaml")
    for name in (
        "module.model.layers.1.self_attn.o_proj",
        "module.model.embed_tokens",
        "module.lm_head",
        "module.model.layers.0.post_attention_layernorm",
        "module.model.norm",
    ):
        cand = back.to_baseline(name, hf.get)
        assert cand in mindspeed, (name, cand)
        assert forward.to_baseline(cand, mindspeed.get) == name


def test_vl_templates_parse_and_cross_levels():
    for file in PRESETS.glob("qwen2.5-vl-*.yaml"):
        mapping = read_layer_mapping(file)
        assert "TopLayer" in mapping.rules
    vl = read_layer_mapping(PRESETS / "qwen2.5-vl-mindspeed-to-hf.yaml")
    classes = {
        "0": "DistributedDataParallel",
        "0.module": "Float16Module",
        "0.module.module": "MultiModalModule",
        "0.module.module.image_encoder": "VisionModel",
        "0.module.module.image_encoder.encoder.blocks.layers.3": "TransformerLayer",
    }
    # Float16Module maps `module.image_encoder` (two levels) to `visual`.
    name = "0.module.module.image_encoder.encoder.blocks.layers.3.self_attention"
    assert vl.to_baseline(name, classes.get) == "module.visual.blocks.3.attn"


def test_bad_layer_mapping_is_one_clear_error(tmp_path):
    bad = tmp_path / "lm.yaml"
    bad.write_text("GPTModel:\n  decoder.layers: [layers]\n")
    with pytest.raises(
        ConfigError, match=r"lm.yaml:2: GPTModel.decoder.layers: expected 'child.path: baseline.path' strings"
    ):
        read_layer_mapping(bad)
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_layer_mapping(Reader(load_yaml("GPTModel: 3\n", "x.yaml"), "x.yaml", "", 1))


def test_longest_key_wins_and_unknown_classes_pass_through():
    mapping = parse_layer_mapping(
        Reader(load_yaml("TopLayer: {a: x}\nA: {b: y, b.c: z}\n", "m.yaml"), "m.yaml", "", 1)
    )
    assert isinstance(mapping, LayerMapping)
    classes = {"a": "A", "a.b": "B"}.get
    assert mapping.to_baseline("a.b.c.d", classes) == "x.z.d"
    assert mapping.to_baseline("a.b.e", classes) == "x.y.e"
    assert mapping.to_baseline("q.r", classes) == "q.r"


LIVE = """
version: 1
models:
  hf: {source: hf, class: transformers.Qwen2ForCausalLM,
       config: {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, tie_word_embeddings: false}}
  wrapped: {source: factory, factory: "engine:build"}
inputs:
  t: {kind: tokens, batch: 2, seq_len: 8, vocab_size: 128, labels: true}
tolerances:
  exact: [{match: "*", atol: 0, rtol: 0, why: same model}]
cases:
  - {name: c, baseline: hf, candidate: wrapped, inputs: t, layer_mapping: lm.yaml,
     phases: [forward, backward], record: {mode: tensor}, tolerances: exact}
"""

ENGINE = """
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


class Engine(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)


def build():
    config = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return Engine(Qwen2ForCausalLM(config))
"""


def test_layer_mapping_in_a_live_case_syncs_and_pairs_everything(tmp_path):
    from pytest_precalign.config.loader import load_config_file
    from pytest_precalign.run.case import run_case

    (tmp_path / "engine.py").write_text(ENGINE)
    # The engine level itself (`module`) has no HF counterpart; its children cross over.
    (tmp_path / "lm.yaml").write_text("TopLayer:\n  module.model: model\n  module.lm_head: lm_head\n")
    (tmp_path / "align.yaml").write_text(LIVE)
    config = load_config_file(tmp_path / "align.yaml")
    run = run_case(config, config.cases[0])
    assert run.sync is not None and run.sync.unsynced == () and run.sync.copied == 27
    for phase in ("forward", "backward"):
        verdict = run.verdicts[phase]
        assert verdict.passed and verdict.compared > 20
        assert [r.name for r in verdict.only_baseline] == []
        assert {r.name for r in verdict.only_candidate} <= {"module"}


def test_layer_mapping_config_errors(tmp_path):
    (tmp_path / "engine.py").write_text(ENGINE)
    with pytest.raises(ConfigError, match=r"cases\[0\].layer_mapping: file not found: .*lm.yaml"):
        load_config(LIVE, tmp_path / "align.yaml")
    bad = LIVE.replace("layer_mapping: lm.yaml", "layer_mapping: 'preset:llama'")
    with pytest.raises(
        ConfigError, match=r"unknown preset 'preset:llama' \(allowed: preset:qwen2.5-mindspeed-to-hf"
    ):
        load_config(bad, tmp_path / "align.yaml")
