"""Unit tests of config parsing: every bad input is one ``ConfigError`` line naming the file,
the line, the key path and what is allowed; good input becomes frozen dataclasses."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable
from pytest_precalign.config.loader import load_config, load_config_file
from pytest_precalign.config.specs import (
    AlignConfig,
    CaseSpec,
    Defaults,
    Dumps,
    InputSpec,
    Models,
    ModelSpec,
    OptimizerSpec,
    RecordSpec,
    TrainingSpec,
)
from pytest_precalign.errors import ConfigError, PrecalignError
from pytest_precalign.mapping.spec import MappingSpec, NameRule, TensorRule, read_mapping_file
from pytest_precalign.mapping.transforms import TransformOp
from pytest_precalign.specs.expectation import Expectation
from pytest_precalign.yaml_reader import load_yaml
from tests.helpers.bad_input import replace_once

# Line numbers below refer to this text; edits keep them (``_variant`` replaces within a line,
# ``+`` appends after line 14).
BASE = """\
version: 1
models:
  base: {source: factory, factory: "tiny_models:build"}
  cand: {source: factory, factory: "tiny_models:build"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 3, vocab_size: 4}
tolerances:
  fp32:
    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}
cases:
  - name: c1
    baseline: base
    candidate: cand
    inputs: toks
"""


def _variant(old: str, new: str, text: str = BASE) -> str:
    return replace_once(text, old, new)


def _load(tmp_path: Path, text: str) -> AlignConfig:
    return load_config(text, tmp_path / "align.yaml")


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as excinfo:
        _load(tmp_path, text)
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


def _assert_message(message: str, file: Path, line: int | None, fragments: tuple[str, ...]) -> None:
    where = f"{file.resolve()}:{line}: " if line is not None else f"{file.resolve()}: "
    assert message.startswith(where), f"{message!r} does not start with {where!r}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# (id, config text, line the message names, fragments it must contain)
BAD: list[tuple[str, str, int | None, tuple[str, ...]]] = [
    ("empty-file", "", None, ("the config is empty", "'version: 1'")),
    ("only-comments", "# nothing here\n", None, ("the config is empty",)),
    (
        "top-level-list",
        "- version: 1\n",
        1,
        ("expected a mapping with keys version, defaults, models", "a list"),
    ),
    ("top-level-scalar", "hello\n", None, ("expected a mapping with keys", "got str 'hello'")),
    (
        "yaml-unclosed-bracket",
        "version: 1\nmodels: {base: [\n",
        3,
        ("YAML syntax error", "expected the node content"),
    ),
    (
        "yaml-bad-indent",
        "version: 1\nmodels:\n  base: x\n cand: y\n",
        4,
        ("YAML syntax error", "started on line 1"),
    ),
    ("yaml-tab", "version: 1\n\tmodels: {}\n", 2, ("YAML syntax error", "'\\t'")),
    ("yaml-duplicate-key", BASE + "version: 1\n", 15, ("duplicate key 'version'", "only once")),
    (
        "yaml-python-tag",
        "version: !!python/object:os.system x\n",
        1,
        ("YAML syntax error", "python/object:os.system"),
    ),
    (
        "version-missing",
        _variant("version: 1\n", "# no version\n"),
        2,  # the mapping starts on line 2
        ("missing required key 'version'", "version: 1"),
    ),
    ("version-2", _variant("version: 1", "version: 2"), 1, ("version: expected 1", "got 2")),
    ("version-string", _variant("version: 1", "version: '1'"), 1, ("version: expected 1", "got '1'")),
    ("version-bool", _variant("version: 1", "version: true"), 1, ("version: expected 1", "got True")),
    (
        "unknown-top-level-key",
        BASE + "model_defaults: {}\n",
        15,
        (
            "model_defaults: unknown key 'model_defaults'",
            "allowed: cases, defaults, inputs, mappings, models, tolerances, version",
        ),
    ),
    (
        "unknown-top-level-key-typo",
        BASE.replace("tolerances:\n  fp32", "tolerance:\n  fp32"),
        7,
        ("unknown key 'tolerance'", "did you mean 'tolerances'?"),
    ),
    (
        "unknown-model-key",
        _variant(
            'base: {source: factory, factory: "tiny_models:build"}',
            'base: {source: factory, factory: "tiny_models:build", colour: red}',
        ),
        3,
        (
            "models.base.colour: unknown key 'colour'",
            "allowed: device, dtype, factory, kwargs, output, patch, runtime, seed, source",
        ),
    ),
    (
        "model-key-typo-is-not-missing-key",
        _variant(
            'base: {source: factory, factory: "tiny_models:build"}',
            'base: {source: factory, factroy: "tiny_models:build"}',
        ),
        3,
        ("models.base.factroy: unknown key 'factroy'", "did you mean 'factory'?"),
    ),
    (
        "unknown-hf-model-key",
        _variant(
            'base: {source: factory, factory: "tiny_models:build"}',
            "base: {source: hf, class: transformers.X, attn: eager}",
        ),
        3,
        (
            "models.base.attn: unknown key 'attn'",
            "allowed: attn_implementation, class, config, device, dtype, output, patch, pretrained, seed, source",
        ),
    ),
    (
        "unknown-case-key",
        BASE + "    baselines: base\n",
        15,
        (
            "cases[0].baselines: unknown key 'baselines'",
            "did you mean 'baseline'?",
            "allowed: baseline, candidate",
        ),
    ),
    (
        "unknown-rule-key",
        _variant(
            '{match: "*", atol: 1.0e-5, rtol: 1.0e-4}', '{match: "*", atol: 1.0e-5, rtol: 1.0e-4, a_tol: 1}'
        ),
        9,
        ("tolerances.fp32[0].a_tol: unknown key 'a_tol'", "allowed: atol, cosine, dtype"),
    ),
    (
        "unknown-inputs-key",
        _variant("vocab_size: 4}", "vocab_size: 4, vocab: 4}"),
        6,
        ("inputs.toks.vocab: unknown key 'vocab'", "allowed: attention_mask, batch, kind"),
    ),
    (
        "unknown-defaults-key",
        BASE + "defaults: {precision: float32}\n",
        15,
        ("defaults.precision: unknown key 'precision'", "allowed: deterministic, device, dtype, seed"),
    ),
    (
        "unknown-optimizer-key",
        BASE
        + "    phases: [forward, backward, step]\n    loss: mean\n    optimizer: {name: sgd, learning_rate: 1}\n",
        17,
        (
            "cases[0].optimizer.learning_rate: unknown key",
            "allowed: betas, clip_grad, eps, lr, micro_batches, momentum, name, no_decay, schedule, weight_decay",
        ),
    ),
    (
        "unknown-expect-key",
        BASE + "    expect: {first_divergence: proj, orign: true}\n",
        15,
        ("cases[0].expect.orign: unknown key 'orign'", "did you mean 'origin'?"),
    ),
    (
        "unknown-source",
        _variant("base: {source: factory,", "base: {source: onnx,"),
        3,
        ("models.base.source: unknown source 'onnx'", "allowed: hf, megatron, factory"),
    ),
    (
        "source-missing",
        _variant("base: {source: factory, ", "base: {"),
        3,
        ("models.base: missing required key 'source'",),
    ),
    (
        "factory-missing",
        _variant('base: {source: factory, factory: "tiny_models:build"}', "base: {source: factory}"),
        3,
        ("models.base: missing required key 'factory'",),
    ),
    (
        "factory-no-colon",
        _variant('"tiny_models:build"}\n  cand', '"nocolon"}\n  cand'),
        3,
        ("models.base.factory: expected 'module:function'", "got 'nocolon'"),
    ),
    (
        "factory-dotted-not-colon",
        _variant('"tiny_models:build"}\n  cand', '"tiny_models.build"}\n  cand'),
        3,
        ("models.base.factory: expected 'module:function' (e.g. my_pkg.models:build)",),
    ),
    (
        "factory-empty-function",
        _variant('"tiny_models:build"}\n  cand', '"tiny_models:"}\n  cand'),
        3,
        ("models.base.factory: expected 'module:function'", "got 'tiny_models:'"),
    ),
    (
        "factory-bad-module-name",
        _variant('"tiny_models:build"}\n  cand', '"my-models:build"}\n  cand'),
        3,
        ("models.base.factory: expected 'module:function'", "got 'my-models:build'"),
    ),
    (
        "factory-not-string",
        _variant('factory: "tiny_models:build"}\n  cand', "factory: 3}\n  cand"),
        3,
        ("models.base.factory: expected a string, got int 3",),
    ),
    (
        "factory-kwargs-not-mapping",
        _variant('"tiny_models:build"}\n  cand', '"tiny_models:build", kwargs: [1]}\n  cand'),
        3,
        ("models.base.kwargs: expected a mapping of keyword arguments, got a list",),
    ),
    (
        "hf-missing-class",
        _variant(
            'base: {source: factory, factory: "tiny_models:build"}',
            "base: {source: hf, config: {hidden_size: 8}}",
        ),
        3,
        ("models.base: an hf model needs 'class'", "or 'pretrained'"),
    ),
    (
        "hf-class-not-dotted",
        _variant(
            'base: {source: factory, factory: "tiny_models:build"}',
            "base: {source: hf, class: Qwen2ForCausalLM}",
        ),
        3,
        ("models.base.class: expected a dotted class path like transformers.Qwen2ForCausalLM",),
    ),
    (
        "hf-config-not-mapping",
        _variant(
            'base: {source: factory, factory: "tiny_models:build"}',
            "base: {source: hf, class: transformers.X, config: [8]}",
        ),
        3,
        ("models.base.config: expected a mapping of config fields, got a list",),
    ),
    (
        "hf-attn-not-string",
        _variant(
            'base: {source: factory, factory: "tiny_models:build"}',
            "base: {source: hf, class: transformers.X, attn_implementation: 1}",
        ),
        3,
        ("models.base.attn_implementation: expected a string, got int 1",),
    ),
    ("models-missing", "version: 1\ncases: []\n", 1, ("missing required key 'models'",)),
    ("models-empty", "version: 1\nmodels: {}\ncases: []\n", 2, ("models: at least one model is required",)),
    (
        "models-a-list",
        "version: 1\nmodels: [base]\ncases: []\n",
        2,
        ("models: expected a mapping, got a list",),
    ),
    (
        "model-null",
        "version: 1\nmodels:\n  base:\ncases: []\n",
        3,
        ("models.base: expected a mapping, got nothing (null)",),
    ),
    ("cases-missing", BASE.split("cases:")[0], 1, ("missing required key 'cases'",)),
    (
        "case-not-mapping",
        _variant("  - name: c1\n", "  - c1\n  - name: c1\n"),
        11,
        ("cases[0]: expected a mapping, got str 'c1'",),
    ),
    (
        "case-name-missing",
        _variant("  - name: c1\n    baseline", "  - baseline"),
        11,
        ("cases[0]: missing required key 'name'",),
    ),
    (
        "case-name-with-space",
        _variant("name: c1", "name: my case"),
        11,
        ("cases[0].name: 'my case' is not a usable case name", "without '[', ']', ':', '/'"),
    ),
    (
        "case-name-dot",  # DIR/. is the whole baseline folder: record --overwrite would delete it
        _variant("name: c1", "name: '.'"),
        11,
        ("cases[0].name: '.' is not a usable case name", "not starting with '.'"),
    ),
    (
        "case-name-dotdot",
        _variant("name: c1", "name: '..'"),
        11,
        ("cases[0].name: '..' is not a usable case name",),
    ),
    (
        "case-name-backslash",
        _variant("name: c1", "name: 'a\\\\b'"),
        11,
        ("is not a usable case name",),
    ),
    (
        "unknown-tolerance-table",
        BASE + "    tolerances: fp16\n",
        15,
        ("cases[0].tolerances: unknown tolerance table 'fp16'", "known: fp32"),
    ),
    (
        "unknown-tolerance-table-none-defined",
        BASE.replace('tolerances:\n  fp32:\n    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}\n', "")
        + "    tolerances: fp32\n",
        12,
        ("cases[0].tolerances: unknown tolerance table 'fp32'", "none defined under 'tolerances'"),
    ),
    (
        "negative-atol",
        _variant("atol: 1.0e-5", "atol: -1.0e-5"),
        9,
        ("tolerances.fp32[0].atol: must be >= 0, got -1e-05",),
    ),
    (
        "negative-bound",
        _variant("atol: 1.0e-5, rtol: 1.0e-4", "max_abs: -1"),
        9,
        ("tolerances.fp32[0].max_abs: must be >= 0",),
    ),
    (
        "nan-rtol",
        _variant("rtol: 1.0e-4", "rtol: .nan"),
        9,
        ("tolerances.fp32[0].rtol: expected a number, got .nan",),
    ),
    (
        "atol-without-rtol",
        _variant("atol: 1.0e-5, rtol: 1.0e-4", "atol: 1.0e-5"),
        9,
        ("tolerances.fp32[0]: atol and rtol must be given together (missing 'rtol')",),
    ),
    (
        "rtol-without-atol",
        _variant("atol: 1.0e-5, rtol: 1.0e-4", "rtol: 1.0e-4"),
        9,
        ("tolerances.fp32[0]: atol and rtol must be given together (missing 'atol')",),
    ),
    (
        "rule-without-bound",
        _variant("atol: 1.0e-5, rtol: 1.0e-4", "why: nothing"),
        9,
        ("tolerances.fp32[0]: a rule must set at least one bound", "atol+rtol, max_abs"),
    ),
    (
        "similarity-above-one",
        _variant("atol: 1.0e-5, rtol: 1.0e-4", "cosine: 1.5"),
        9,
        ("cosine: must be between 0 and 1",),
    ),
    (
        "rule-unknown-kind",
        _variant('match: "*",', 'match: "*", kind: weights,'),
        9,
        ("tolerances.fp32[0].kind: unknown value 'weights'", "allowed: activation, input"),
    ),
    (
        "rule-unknown-phase",
        _variant('match: "*",', 'match: "*", phase: fwd,'),
        9,
        ("tolerances.fp32[0].phase: unknown value 'fwd'", "allowed: forward, backward, step"),
    ),
    (
        "rule-dtype-alias",
        _variant('match: "*",', 'match: "*", dtype: [float32, fp16],'),
        9,
        ("tolerances.fp32[0].dtype: unknown dtype 'fp16'", "did you mean 'float16'?"),
    ),
    (
        "rule-dtype-torch-prefix",
        _variant('match: "*",', 'match: "*", dtype: torch.bfloat16,'),
        9,
        ("unknown dtype 'torch.bfloat16'", "did you mean 'bfloat16'?"),
    ),
    (
        "rule-bad-step",
        _variant('match: "*",', 'match: "*", step: -1,'),
        9,
        ("tolerances.fp32[0].step: expected a step number or a list of them, got -1",),
    ),
    (
        "rule-not-mapping",
        _variant('- {match: "*", atol: 1.0e-5, rtol: 1.0e-4}', "- 1.0e-5"),
        9,
        ("tolerances.fp32[0]: expected a mapping, got float",),
    ),
    (
        "table-not-a-list",
        _variant('\n    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}', " 5"),
        8,
        ("tolerances.fp32: expected a list of rules, {rules: [...]}, or the path of a YAML file, got int 5",),
    ),
    (
        "table-mapping-unknown-key",
        _variant('\n    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}', " {rule: []}"),
        8,
        ("tolerances.fp32.rule: unknown key 'rule'", "allowed: rules"),
    ),
    (
        "table-file-missing",
        _variant('\n    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}', " tables/fp32.yaml"),
        8,
        ("tolerances.fp32: file not found:", "tables/fp32.yaml"),
    ),
    (
        "case-unknown-baseline",
        _variant("baseline: base", "baseline: bsae"),
        12,
        ("cases[0].baseline: unknown model 'bsae'", "known: base, cand"),
    ),
    (
        "case-unknown-candidate",
        _variant("candidate: cand", "candidate: other"),
        13,
        ("cases[0].candidate: unknown model 'other'", "known: base, cand"),
    ),
    (
        "case-unknown-inputs",
        _variant("    inputs: toks\n", "    inputs: tokens\n"),
        14,
        ("cases[0].inputs: unknown inputs 'tokens'", "known: toks"),
    ),
    (
        "case-unknown-phase",
        BASE + "    phases: [forward, bakward]\n",
        15,
        ("cases[0].phases: unknown phase 'bakward'", "allowed: forward, backward, step"),
    ),
    (
        "case-phases-empty",
        BASE + "    phases: []\n",
        15,
        ("cases[0].phases: expected a non-empty list of phases",),
    ),
    (
        "case-phase-twice",
        BASE + "    phases: [forward, forward]\n",
        15,
        ("cases[0].phases: phases are listed twice",),
    ),
    (
        "backward-without-labels",
        BASE + "    phases: [forward, backward]\n",
        15,
        ("cases[0].phases: phase 'backward' with loss 'causal_lm' needs labels", "inputs.toks", "loss: mean"),
    ),
    (
        "backward-with-loss-none",
        BASE + "    phases: [backward]\n    loss: none\n",
        16,
        ("cases[0].loss: phase 'backward' needs a loss",),
    ),
    (
        "expect-phase-not-run",
        BASE + "    expect: {phase: backward, first_divergence: proj}\n",
        15,
        ("cases[0].expect.phase: phase 'backward' is not among the case's phases (forward)",),
    ),
    (
        "expect-first-divergence-missing",
        BASE + "    expect: {phase: forward}\n",
        15,
        ("cases[0].expect: missing required key 'first_divergence'",),
    ),
    (
        "min-coverage-above-1",
        BASE + "    min_coverage: 1.5\n",
        15,
        ("cases[0].min_coverage: expected a share between 0 and 1", "got 1.5"),
    ),
    (
        "min-coverage-negative",
        BASE + "    min_coverage: -0.1\n",
        15,
        ("cases[0].min_coverage: expected a share between 0 and 1", "got -0.1"),
    ),
    (
        "min-coverage-not-a-number",
        BASE + "    min_coverage: half\n",
        15,
        ("cases[0].min_coverage:",),
    ),
    (
        "duplicate-case-name",
        BASE + "  - {name: c1, baseline: cand, candidate: base, inputs: toks}\n",
        15,
        ("cases[1].name: duplicate case name 'c1'",),
    ),
    (
        "string-for-integer",
        _variant("seq_len: 3", "seq_len: three"),
        6,
        ("inputs.toks.seq_len: expected an integer, got str 'three'",),
    ),
    (
        "float-for-integer",
        _variant("batch: 2", "batch: 2.5"),
        6,
        ("inputs.toks.batch: expected an integer, got float 2.5",),
    ),
    (
        "bool-for-integer",
        _variant("batch: 2", "batch: yes"),
        6,
        ("inputs.toks.batch: expected an integer, got True",),
    ),
    (
        "integer-below-minimum",
        _variant("batch: 2", "batch: 0"),
        6,
        ("inputs.toks.batch: must be >= 1, got 0",),
    ),
    (
        "string-for-number",
        _variant("atol: 1.0e-5", "atol: 1e-5x"),
        9,
        ("tolerances.fp32[0].atol: expected a number, got str '1e-5x'",),
    ),
    (
        "bool-for-number",
        _variant("rtol: 1.0e-4", "rtol: false"),
        9,
        ("tolerances.fp32[0].rtol: expected a number, got False",),
    ),
    (
        "string-for-bool",
        BASE + "    weights: {sync: maybe}\n",
        15,
        ("cases[0].weights.sync: expected true or false, got str 'maybe'",),
    ),
    (
        "string-for-mapping",
        BASE + "    optimizer: adamw\n",
        15,
        ("cases[0].optimizer: expected a mapping, got str 'adamw'",),
    ),
    (
        "string-for-case-name",
        _variant("name: c1", "name: 2024-01-01"),
        11,
        ("cases[0].name: expected a string, got date",),
    ),
    (
        "inputs-kind-missing",
        _variant("{kind: tokens, batch", "{batch"),
        6,
        ("inputs.toks: missing required key 'kind' (allowed: tokens, factory, ids, dataset)",),
    ),
    (
        "inputs-vocab-missing",
        _variant(", vocab_size: 4}", "}"),
        6,
        ("inputs.toks: missing required key 'vocab_size'",),
    ),
    (
        "inputs-factory-with-token-key",
        _variant(
            "{kind: tokens, batch: 2, seq_len: 3, vocab_size: 4}",
            "{kind: factory, factory: 'tiny_models:inputs', seq_len: 3}",
        ),
        6,
        ("inputs.toks.seq_len: unknown key 'seq_len'", "allowed: factory, kind, kwargs, labels, seed"),
    ),
    (
        "defaults-unknown-device",
        BASE + "defaults: {device: tpu}\n",
        15,
        ("defaults.device: unknown value 'tpu' (allowed: cpu, cuda, npu)",),
    ),
    (
        "model-unknown-dtype",
        _variant('"tiny_models:build"}\n  cand', '"tiny_models:build", dtype: fp32}\n  cand'),
        3,
        ("models.base.dtype: unknown value 'fp32' (allowed: float32, float16, bfloat16, float64, keep)",),
    ),
    # mappings, inline under 'mappings:' (line 15 is 'mappings:', 16 the mapping name)
    (
        "mapping-unknown-op",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - baseline: a.weight\n        candidate: b.weight\n        transform: {op: flip}\n",
        20,
        (
            "mappings.m.tensors[0].transform[0].op: unknown value 'flip'",
            "allowed: concat, split, permute, transpose",
        ),
    ),
    (
        "mapping-op-missing",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: a, candidate: b, transform: {dims: [1, 0]}}\n",
        18,
        ("mappings.m.tensors[0].transform[0]: missing required key 'op'", "allowed: concat, split"),
    ),
    (
        "mapping-op-param-typo",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: [q, k, v], candidate: qkv, transform: {op: qkv_fuse, num_heads: 4, num_kv_head: 2}}\n",
        18,
        (
            "transform[0].num_kv_head: unknown key 'num_kv_head'",
            "did you mean 'num_kv_heads'?",
            "allowed: dim, num_heads, num_kv_heads, op",
        ),
    ),
    (
        "mapping-op-param-type",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: a, candidate: b, transform: {op: transpose, dim0: 0, dim1: one}}\n",
        18,
        ("mappings.m.tensors[0].transform[0].dim1: expected an integer, got 'one'",),
    ),
    (
        "mapping-qkv-heads",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: [q, k, v], candidate: qkv, transform: {op: qkv_fuse, num_heads: 4, num_kv_heads: 3}}\n",
        18,
        ("transform[0]: num_heads (4) must be a multiple of num_kv_heads (3)",),
    ),
    (
        "mapping-arity-in",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: [q, k], candidate: qkv, transform: {op: qkv_fuse, num_heads: 4, num_kv_heads: 2}}\n",
        18,
        ("mappings.m.tensors[0].transform: op 'qkv_fuse' takes 3 tensor(s) but gets 2",),
    ),
    (
        "mapping-arity-out",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: [a, b], candidate: [c, d], transform: {op: concat}}\n",
        18,
        ("mappings.m.tensors[0].transform: the transform yields 1 tensor(s) but 'candidate' names 2",),
    ),
    (
        "mapping-split-arity",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: a, candidate: [b, c], transform: {op: split, sizes: [1, 2, 3]}}\n",
        18,
        ("the transform yields 3 tensor(s) but 'candidate' names 2",),
    ),
    (
        "mapping-placeholders-differ",
        BASE
        + "mappings:\n  m:\n    renames:\n      - {baseline: 'model.layers.{i}', candidate: 'decoder.layers.{j}'}\n",
        18,
        (
            "mappings.m.renames[0]: baseline and candidate must use the same {placeholders}",
            "baseline has {i}, candidate has {j}",
        ),
    ),
    (
        "mapping-placeholder-missing",
        BASE
        + "mappings:\n  m:\n    renames:\n      - {baseline: 'model.layers.{i}', candidate: 'decoder.layers'}\n",
        18,
        ("baseline has {i}, candidate has none",),
    ),
    (
        "mapping-unknown-key",
        BASE + "mappings:\n  m:\n    rename:\n      - {baseline: a, candidate: b}\n",
        17,
        (
            "mappings.m.rename: unknown key 'rename'",
            "did you mean 'renames'?",
            "allowed: layouts, renames, slots, tensors, unmatched",
        ),
    ),
    (
        "mapping-rule-unknown-key",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: a, candidate: b, transform: [], kind: param}\n",
        18,
        ("mappings.m.tensors[0].kind: unknown key 'kind'", "did you mean 'kinds'?"),
    ),
    (
        "mapping-unknown-record-kind",
        BASE
        + "mappings:\n  m:\n    tensors:\n      - {baseline: a, candidate: b, transform: [], kinds: [params]}\n",
        18,
        ("mappings.m.tensors[0].kinds: unknown record kind 'params'", "allowed: activation, input"),
    ),
    (
        "mapping-transform-scalar",
        BASE + "mappings:\n  m:\n    tensors:\n      - {baseline: a, candidate: b, transform: transpose}\n",
        18,
        (
            "mappings.m.tensors[0].transform: expected an op ({op: ...}) or a list of ops, got str 'transpose'",
        ),
    ),
    (
        "mapping-empty-pattern",
        BASE + "mappings:\n  m:\n    tensors:\n      - {baseline: [], candidate: b, transform: []}\n",
        18,
        ("mappings.m.tensors[0].baseline: expected a name pattern or a non-empty list of them",),
    ),
    (
        "mapping-file-missing",
        BASE + "mappings:\n  m: maps/m.yaml\n",
        16,
        ("mappings.m: file not found:", "maps/m.yaml"),
    ),
    (
        "case-unknown-mapping",
        BASE + "    mapping: qwen\n",
        15,
        (
            "cases[0].mapping: unknown mapping 'qwen'",
            "known: preset:megatron-qwen2.5, preset:megatron-llama, preset:megatron-qwen3, "
            "preset:megatron-mixtral, preset:megatron-qwen3-moe; or a .yaml file",
        ),
    ),
    (
        "case-mapping-file-missing",
        BASE + "    mapping: qwen.yaml\n",
        15,
        ("cases[0].mapping: file not found:", "qwen.yaml"),
    ),
]


@pytest.mark.parametrize(("text", "line", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_is_one_message(
    tmp_path: Path, text: str, line: int | None, fragments: tuple[str, ...]
) -> None:
    message = _error(tmp_path, text)
    _assert_message(message, tmp_path / "align.yaml", line, fragments)


def test_bad_ids_are_unique() -> None:
    ids = [b[0] for b in BAD]
    assert len(ids) == len(set(ids))


def test_base_config_is_valid(tmp_path: Path) -> None:
    """The bad inputs above are edits of BASE, so BASE itself must load."""
    config = _load(tmp_path, BASE)
    assert [c.name for c in config.cases] == ["c1"]


# -- files ---------------------------------------------------------------------------------


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found$"):
        load_config_file(tmp_path / "nope.yaml")


def test_config_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory, expected an alignment YAML file"):
        load_config_file(tmp_path)


def test_config_file_not_utf8(tmp_path: Path) -> None:
    file = tmp_path / "latin1.yaml"
    file.write_bytes("version: 1 # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as excinfo:
        load_config_file(file)
    assert str(excinfo.value) == f"{file}: not UTF-8 text (byte 16); expected an alignment YAML file"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"version: 1\n\0\0\0binary", "a binary file (NUL bytes); expected an alignment YAML file"),
        (b"[" * 50_000 + b"]" * 50_000, "nested too deeply to be a config (thousands of levels)"),
    ],
    ids=["binary", "deeply-nested"],
)
def test_binary_or_deeply_nested_config_is_one_message(tmp_path: Path, content: bytes, message: str) -> None:
    file = tmp_path / "cfg.yaml"
    file.write_bytes(content)
    with pytest.raises(ConfigError) as excinfo:
        load_config_file(file)
    assert str(excinfo.value).endswith(message), str(excinfo.value)


def test_a_huge_config_is_refused_by_its_size_before_it_is_read(tmp_path: Path) -> None:
    """A sparse file: 2 GiB on paper, no disk used; refused by its size, not read."""
    file = tmp_path / "huge.yaml"
    with file.open("wb") as handle:
        handle.write(b"version: 1\n")
        handle.truncate(2 << 30)
    with pytest.raises(ConfigError) as excinfo:
        load_config_file(file)
    assert str(excinfo.value) == f"{file}: {2 << 30} bytes; expected an alignment YAML file of at most 16 MiB"


def test_load_config_file_resolves_and_digests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "align.yaml").write_text(BASE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    config = load_config_file("align.yaml")
    assert config.path == tmp_path.resolve() / "align.yaml"
    assert config.base_dir == tmp_path.resolve()
    assert config.digest == hashlib.sha256(BASE.encode("utf-8")).hexdigest()


def test_error_in_tolerance_file_names_that_file(tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    table = tmp_path / "tables" / "fp32.yaml"
    table.write_text("rules:\n  - {atol: 1.0e-5, rtol: 1.0e-4}\n  - {atol: -1, rtol: 0}\n", encoding="utf-8")
    text = _variant('\n    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}', " tables/fp32.yaml")
    message = _error(tmp_path, text)
    assert message == f"{table}:3: rules[1].atol: must be >= 0, got -1.0"


def test_error_in_mapping_file_names_that_file(tmp_path: Path) -> None:
    file = tmp_path / "m.yaml"
    file.write_text("renames:\n  - {baseline: a, candidate: b}\n  - {baseline: c}\n", encoding="utf-8")
    message = _error(tmp_path, BASE + "    mapping: m.yaml\n")
    assert message == f"{file}:3: renames[1]: missing required key 'candidate'"


def test_yaml_syntax_error_in_mapping_file(tmp_path: Path) -> None:
    file = tmp_path / "m.yaml"
    file.write_text("renames:\n  - {baseline: a, candidate: b\n", encoding="utf-8")
    with pytest.raises(ConfigError) as excinfo:
        read_mapping_file(file, "m")
    assert str(excinfo.value).startswith(f"{file}:3: YAML syntax error:")


def test_mapping_file_must_be_a_mapping(tmp_path: Path) -> None:
    file = tmp_path / "m.yaml"
    file.write_text("- {baseline: a, candidate: b}\n", encoding="utf-8")
    message = _error(tmp_path, BASE + "mappings:\n  m: m.yaml\n")
    assert message == f"{file}:1: expected a mapping, got a list"


def test_case_lookup_names_known_cases(tmp_path: Path) -> None:
    config = _load(tmp_path, BASE)
    assert config.case("c1") is config.cases[0]
    with pytest.raises(ConfigError, match=r"no case named 'c2' \(known: c1\)$"):
        config.case("c2")


def test_config_error_is_a_precalign_error() -> None:
    """The plugin and CLI catch PrecalignError; every config problem must be one."""
    assert issubclass(ConfigError, PrecalignError)


# -- good input ------------------------------------------------------------------------------


def test_minimal_config(tmp_path: Path) -> None:
    config = _load(tmp_path, BASE)
    file = str((tmp_path / "align.yaml").resolve())
    assert config.version == 1
    assert config.defaults == Defaults()
    assert config.models == {
        "base": ModelSpec(
            name="base",
            source="factory",
            options={"factory": "tiny_models:build"},
            device="cpu",
            dtype="keep",  # a factory's model keeps its own dtypes unless the config says
            seed=0,
            output=None,
            where=f"{file}:3",
        ),
        "cand": ModelSpec(
            name="cand",
            source="factory",
            options={"factory": "tiny_models:build"},
            device="cpu",
            dtype="keep",  # a factory's model keeps its own dtypes unless the config says
            seed=0,
            output=None,
            where=f"{file}:4",
        ),
    }
    assert config.inputs == {
        "toks": InputSpec(name="toks", kind="tokens", batch=2, seq_len=3, vocab_size=4, where=f"{file}:6")
    }
    assert config.tolerances == {
        "fp32": ToleranceTable(
            name="fp32", rules=(ToleranceRule(match="*", atol=1e-5, rtol=1e-4, where=f"{file}:9"),)
        )
    }
    assert config.mappings == {}
    assert config.cases == (
        CaseSpec(
            name="c1",
            sides=Models("base", "cand"),
            inputs="toks",
            phases=("forward",),
            steps=1,
            sync_weights=True,
            strict_weights=True,
            mapping=None,
            training=TrainingSpec(OptimizerSpec(), loss="causal_lm", train=False),
            record=RecordSpec(),
            tolerances=None,
            expect=None,
            where=f"{file}:11",
        ),
    )


def test_a_case_has_two_models_or_two_stored_runs(tmp_path: Path) -> None:
    """``sides``: the case's models by name, or its stored runs (named ``dump:<path as given>``
    in reports); asking a dumps case for its models is one ConfigError naming the case."""
    assert _load(tmp_path, BASE).cases[0].sides == Models("base", "cand")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    text = "version: 1\ncases:\n  - {name: d, baseline: {dump: a}, candidate: {dump: b}}\n"
    case = _load(tmp_path, text).cases[0]
    assert case.sides == Dumps(tmp_path / "a", tmp_path / "b", ("dump:a", "dump:b"))
    assert case.dumps is case.sides and case.sides.names == ("dump:a", "dump:b")
    with pytest.raises(ConfigError, match=r"case 'd' gates stored runs \(\{dump: path\}\), not models"):
        case.models  # noqa: B018


def test_parsed_config_is_frozen(tmp_path: Path) -> None:
    config = _load(tmp_path, BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.cases[0].name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.models["base"].dtype = "float16"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.tolerances["fp32"].rules[0].atol = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.version = 2  # type: ignore[misc]


FULL = """\
version: 1
defaults: {device: cpu, dtype: float64, seed: 7, deterministic: false}
models:
  ref:
    source: hf
    class: transformers.Qwen2ForCausalLM
    config: &tiny {vocab_size: 16, hidden_size: 8}
    attn_implementation: eager
  port:
    source: factory
    factory: my_pkg.models:build
    kwargs: {layers: 2}
    dtype: float32
    seed: 3
    output: logits
inputs:
  toks: {kind: tokens, batch: 1, seq_len: 5, vocab_size: 16, labels: true, attention_mask: true}
  custom: {kind: factory, factory: "my_inputs:make", kwargs: {n: 3}, labels: true}
tolerances:
  strict:
    rules:
      - {match: "model.layers.*", kind: [activation, logits], phase: forward, dtype: float32, step: [0, 1], atol: 0, rtol: 0, why: exact}
      - {kind: loss, max_abs: 1.0e-6, cosine: 0.999, why: loss}
  from_file: tables/t.yaml
mappings:
  inline:
    renames:
      - {baseline: "model.layers.{i}", candidate: "decoder.{i}"}
    tensors:
      - baseline: ["model.layers.{i}.q.weight", "model.layers.{i}.k.weight", "model.layers.{i}.v.weight"]
        candidate: "decoder.{i}.qkv.weight"
        transform:
          - {op: qkv_fuse, num_heads: 4, num_kv_heads: 2}
          - {op: transpose, dim0: 0, dim1: 1}
  on_disk: maps/m.yaml
cases:
  - name: train_step
    baseline: ref
    candidate: port
    inputs: toks
    phases: [step, forward]
    steps: 2
    weights: {sync: true, strict: false}
    mapping: inline
    optimizer: {name: sgd, lr: 0.5, betas: [0.8, 0.9], eps: 1.0e-6, weight_decay: 0.1, momentum: 0.9}
    record: {mode: tensor, inputs: false, include: "model.*", exclude: ["*.dropout", "*.act"]}
    tolerances: strict
    expect: {phase: backward, first_divergence: model.layers.1.mlp, origin: true, kind: grad_input}
    loss: causal_lm
    train: true
  - name: by_file
    baseline: port
    candidate: ref
    inputs: custom
    mapping: maps/other.yml
    tolerances: from_file
    weights: {sync: false}
    loss: model
"""


def test_full_config(tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "t.yaml").write_text("- {max_rel: 0.5}\n", encoding="utf-8")
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "m.yaml").write_text("renames: [{baseline: a, candidate: b}]\n", encoding="utf-8")
    (tmp_path / "maps" / "other.yml").write_text(
        "tensors:\n  - {baseline: w, candidate: [w1, w2], transform: {op: split, sizes: [2, 2], dim: 1}}\n",
        encoding="utf-8",
    )
    config = _load(tmp_path, FULL)
    file = str((tmp_path / "align.yaml").resolve())

    assert config.defaults == Defaults(
        device="cpu", dtype="float64", seed=7, deterministic=False, dtype_given=True
    )
    ref, port = config.models["ref"], config.models["port"]
    assert ref == ModelSpec(
        name="ref",
        source="hf",
        options={
            "class": "transformers.Qwen2ForCausalLM",
            "config": {"vocab_size": 16, "hidden_size": 8},
            "attn_implementation": "eager",
        },
        device="cpu",
        dtype="float64",  # from defaults
        seed=7,
        output=None,
        where=f"{file}:4",
    )
    assert port == ModelSpec(
        name="port",
        source="factory",
        options={"factory": "my_pkg.models:build", "kwargs": {"layers": 2}},
        device="cpu",
        dtype="float32",
        seed=3,
        output="logits",
        where=f"{file}:9",
    )
    assert config.inputs["toks"] == InputSpec(
        name="toks",
        kind="tokens",
        batch=1,
        seq_len=5,
        vocab_size=16,
        seed=7,
        labels=True,
        attention_mask=True,
        where=f"{file}:17",
    )
    assert config.inputs["custom"] == InputSpec(
        name="custom",
        kind="factory",
        seed=7,
        labels=True,
        factory="my_inputs:make",
        kwargs={"n": 3},
        where=f"{file}:18",
    )

    strict = config.tolerances["strict"]
    assert strict == ToleranceTable(
        name="strict",
        rules=(
            ToleranceRule(
                match="model.layers.*",
                kind=("activation", "logits"),
                phase=("forward",),
                dtype=("float32",),
                step=(0, 1),
                atol=0.0,
                rtol=0.0,
                why="exact",
                where=f"{file}:22",
            ),
            ToleranceRule(
                kind=("loss",), bounds=(("max_abs", 1e-6), ("cosine", 0.999)), why="loss", where=f"{file}:23"
            ),
        ),
    )
    table_file = str((tmp_path / "tables" / "t.yaml").resolve())
    assert config.tolerances["from_file"] == ToleranceTable(
        name="from_file", rules=(ToleranceRule(bounds=(("max_rel", 0.5),), where=f"{table_file}:1"),)
    )

    inline = config.mappings["inline"]
    assert inline == MappingSpec(
        name="inline",
        renames=(NameRule(baseline="model.layers.{i}", candidate="decoder.{i}"),),
        tensors=(
            TensorRule(
                baseline=(
                    "model.layers.{i}.q.weight",
                    "model.layers.{i}.k.weight",
                    "model.layers.{i}.v.weight",
                ),
                candidate=("decoder.{i}.qkv.weight",),
                ops=(
                    TransformOp("qkv_fuse", (("num_heads", 4), ("num_kv_heads", 2))),
                    TransformOp("transpose", (("dim0", 0), ("dim1", 1))),
                ),
                kinds=("param",),
                where=f"{file}:30",
            ),
        ),
        where=f"{file}:26",
    )
    on_disk = config.mappings["on_disk"]
    assert on_disk.name == "on_disk"
    assert on_disk.renames == (NameRule(baseline="a", candidate="b"),)

    train, by_file = config.cases
    # 'step' needs grads: backward is added, and phases come in run order.
    assert train.phases == ("forward", "backward", "step")
    assert train.steps == 2
    assert (train.sync_weights, train.strict_weights) == (True, False)
    assert train.mapping == inline  # instantiated per case with its models' $variables
    assert train.training.optimizer == OptimizerSpec(
        name="sgd", lr=0.5, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, momentum=0.9
    )
    assert train.record == RecordSpec(
        mode="tensor", inputs=False, include=("model.*",), exclude=("*.dropout", "*.act")
    )
    assert train.tolerances == "strict"
    assert train.expect == Expectation(
        phase="backward",
        first_divergence="model.layers.1.mlp",
        origin=True,
        kind="grad_input",
        where=f"{file}:48",
    )
    assert (train.training.loss, train.training.train) == ("causal_lm", True)

    assert by_file.phases == ("forward",)
    assert by_file.sync_weights is False
    assert by_file.training.loss == "model"
    assert by_file.tolerances == "from_file"
    assert by_file.mapping is not None
    assert by_file.mapping.name == "maps/other.yml"
    assert by_file.mapping.tensors[0].ops == (TransformOp("split", (("sizes", [2, 2]), ("dim", 1))),)


def test_yaml_anchors_and_merge_keys(tmp_path: Path) -> None:
    text = _variant(
        'models:\n  base: {source: factory, factory: "tiny_models:build"}\n  cand: {source: factory, factory: "tiny_models:build"}\n',
        'models:\n  base: &m {source: factory, factory: "tiny_models:build", seed: 1}\n  cand: {<<: *m, seed: 2}\n',
    )
    config = _load(tmp_path, text)
    assert config.models["base"].options == config.models["cand"].options == {"factory": "tiny_models:build"}
    assert (config.models["base"].seed, config.models["cand"].seed) == (1, 2)


def test_duplicate_key_next_to_merge_key_is_still_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^src:1: duplicate key 'c'"):
        load_yaml("y: {<<: {b: 1}, c: 3, c: 4}\n", "src")


def test_tolerance_table_lookup_first_match_wins(tmp_path: Path) -> None:
    text = _variant(
        '    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}\n',
        '    - {match: "proj*", kind: activation, atol: 0.5, rtol: 0.25, why: proj}\n'
        '    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}\n',
    )
    table = _load(tmp_path, text).tolerances["fp32"]
    hit = table.lookup("proj.out", "activation", "forward", "float32", 0)
    assert (hit.atol, hit.rtol, hit.why) == (0.5, 0.25, "proj")
    other_kind = table.lookup("proj.out", "param", "forward", "float32", 0)
    assert (other_kind.atol, other_kind.rtol) == (1e-5, 1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn", "int64", "bool", "complex64"])
def test_rule_accepts_torch_dtype_names(tmp_path: Path, dtype: str) -> None:
    text = _variant('match: "*",', f'match: "*", dtype: {dtype},')
    assert _load(tmp_path, text).tolerances["fp32"].rules[0].dtype == (dtype,)


def test_backward_with_factory_inputs_is_not_checked_for_labels(tmp_path: Path) -> None:
    """Factory inputs may bring their own labels: only token inputs are checked at load."""
    text = _variant(
        "{kind: tokens, batch: 2, seq_len: 3, vocab_size: 4}",
        "{kind: factory, factory: 'tiny_models:inputs'}",
    )
    config = _load(tmp_path, text + "    phases: [forward, backward]\n")
    assert config.cases[0].phases == ("forward", "backward")


def test_min_coverage_defaults_to_one_half_and_is_read_per_case(tmp_path: Path) -> None:
    assert _load(tmp_path, BASE).cases[0].min_coverage == 0.5
    assert _load(tmp_path, BASE + "    min_coverage: 0.25\n").cases[0].min_coverage == 0.25
    assert _load(tmp_path, BASE + "    min_coverage: 0\n").cases[0].min_coverage == 0.0


def test_record_golden_is_resolved_and_checked(tmp_path: Path) -> None:
    """``record: {golden: PATH}``: resolved beside the config; a missing path or tensor mode
    is one message naming the key."""
    (tmp_path / "runs" / "gold").mkdir(parents=True)
    good = BASE + "    record: {mode: stats, golden: runs/gold}\n"
    assert _load(tmp_path, good).cases[0].record.golden == (tmp_path / "runs" / "gold").resolve()
    assert _load(tmp_path, BASE).cases[0].record.golden is None
    missing = _error(tmp_path, BASE + "    record: {golden: runs/none}\n")
    assert "cases[0].record.golden" in missing and str(tmp_path / "runs" / "none") in missing
    tensor = _error(tmp_path, BASE + "    record: {mode: tensor, golden: runs/gold}\n")
    assert "cases[0].record.golden" in tensor and "use mode stats or hash" in tensor


@pytest.mark.parametrize(
    ("written", "read"),
    [("", "native"), ("native", "native"), ("precalign", "native"), ("msprobe", "msprobe")],
)
def test_record_format_is_native_everywhere_precalign_an_alias(
    tmp_path: Path, written: str, read: str
) -> None:
    """``record.format`` has the Recorder's name for our format (``native``); ``precalign``, the
    older name, still reads. A config case, the align marker and the Recorder share one default
    record mode (``stats``)."""
    from pytest_precalign import Recorder
    from pytest_precalign.align_runner import AlignRunner

    record = f"    record: {{format: {written}}}\n" if written else ""
    spec = _load(tmp_path, BASE + record).case("c1").record
    assert (spec.format, spec.mode) == (read, "stats")
    assert Recorder(tmp_path / "r", format=written or "native").format == read
    marker = pytest.mark.align().mark
    assert AlignRunner.from_marker(None, marker, "t", lambda o: None).record.mode == "stats"
