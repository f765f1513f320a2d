"""Bad input shared by the CLI's and the plugin's bad-input tests: a tiny model module
(``tiny_models.py``), a valid config (``GOOD``) and its edits, and the source errors each must
report as one message."""

from __future__ import annotations


def replace_once(text: str, old: str, new: str) -> str:
    """``text`` with ``old``, which it must hold exactly once, replaced by ``new``: a config
    edited without moving its other lines (error messages name line numbers)."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


TINY_MODELS = """
import torch


class Tiny(torch.nn.Module):
    def __init__(self, vocab=4, width=4):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.proj = torch.nn.Sequential(torch.nn.Linear(width, vocab))

    def forward(self, input_ids):
        return self.proj(self.emb(input_ids))


def build(**kwargs):
    return Tiny(**kwargs)


def build_raises():
    raise RuntimeError("kaboom: no weights for layer 3")


def build_not_module():
    return {"not": "a module"}


def build_data_dependent():
    # Works on the CPU, but not on the meta device the preflight tries first.
    model = Tiny()
    if float(model.emb.weight.detach().abs().sum()) <= 0:
        raise AssertionError("unreachable")
    return model


def inputs_raises():
    raise ValueError("no tokenizer here")


NOT_CALLABLE = 3
"""

GOOD = """\
version: 1
models:
  base: {source: factory, factory: "tiny_models:build"}
  cand: {source: factory, factory: "tiny_models:build"}
inputs:
  toks: {kind: tokens, batch: 1, seq_len: 3, vocab_size: 4}
cases:
  - name: c1
    baseline: base
    candidate: cand
    inputs: toks
"""


def variant(old: str, new: str, text: str = GOOD) -> str:
    """``text`` (GOOD) with ``old``, which it holds once, replaced by ``new``."""
    return replace_once(text, old, new)


def with_factory(path: str) -> str:
    return variant(
        'cand: {source: factory, factory: "tiny_models:build"}',
        f'cand: {{source: factory, factory: "{path}"}}',
    )


# Source errors: found by the preflight (meta device, then CPU) before any test runs. Every one
# goes through the CLI's ``validate`` in process (fast, tests/cli/test_bad_input.py); the pytest
# plugin, whose runs must import torch in a subprocess, gets a representative few of them
# (tests/integration/test_bad_input.py).

HF_MODEL = "cand: {source: hf, class: %s, config: {vocab_size: 4}}"

# (id, config text, fragments after "<cfg>:<line>: ")
SOURCE_ERRORS: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "module-not-importable",
        with_factory("no_such_module:build"),
        (":4: models.cand.factory: cannot import module 'no_such_module' from 'no_such_module:build'",),
    ),
    (
        "attribute-missing",
        with_factory("tiny_models:missing_attr"),
        (":4: models.cand.factory: module 'tiny_models' has no attribute 'missing_attr'",),
    ),
    (
        "not-callable",
        with_factory("tiny_models:NOT_CALLABLE"),
        (":4: models.cand.factory: 'tiny_models:NOT_CALLABLE' is not callable",),
    ),
    (
        "factory-raises",
        with_factory("tiny_models:build_raises"),
        (
            ":4: models.cand.factory: tiny_models:build_raises(**{}) raised RuntimeError: kaboom: no weights for layer 3",
        ),
    ),
    (
        "factory-bad-kwargs",
        variant(
            'cand: {source: factory, factory: "tiny_models:build"}',
            'cand: {source: factory, factory: "tiny_models:build", kwargs: {depth: 2}}',
        ),
        (":4: models.cand.factory: tiny_models:build(**{'depth': 2}) raised TypeError", "depth"),
    ),
    (
        "factory-returns-no-module",
        with_factory("tiny_models:build_not_module"),
        (":4: models.cand.factory: tiny_models:build_not_module returned dict, expected a torch.nn.Module",),
    ),
    (
        "module-import-raises",
        with_factory("broken_models:build"),
        (":4: models.cand.factory: importing 'broken_models' raised ZeroDivisionError",),
    ),
    (
        # Inputs are not built before the case runs (validate stays cheap): their factory must
        # import; what it raises when called is the case's error (tests/cli/test_run.py).
        "inputs-factory-missing",
        variant(
            "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 4}",
            "{kind: factory, factory: 'tiny_models:no_inputs_here'}",
        ),
        (":6: inputs.toks.factory: module 'tiny_models' has no attribute 'no_inputs_here'",),
    ),
    (
        "error-in-second-case",
        variant(
            "inputs:\n",
            '  bad: {source: factory, factory: "tiny_models:build_raises"}\ninputs:\n',
            GOOD + "  - {name: broken, baseline: base, candidate: bad, inputs: toks}\n",
        ),
        (":5: models.bad.factory: tiny_models:build_raises(**{}) raised RuntimeError: kaboom",),
    ),
    (
        "hf-class-missing",
        variant(
            'cand: {source: factory, factory: "tiny_models:build"}',
            HF_MODEL % "transformers.NoSuchModelForCausalLM",
        ),
        (":4: models.cand.class: module 'transformers' has no attribute 'NoSuchModelForCausalLM'",),
    ),
    (
        "hf-class-not-a-model",
        variant('cand: {source: factory, factory: "tiny_models:build"}', HF_MODEL % "tiny_models.Tiny"),
        (":4: models.cand.class: tiny_models.Tiny has no config_class; is it a transformers model?",),
    ),
    (
        "hf-pretrained-dir-missing",
        variant(
            'cand: {source: factory, factory: "tiny_models:build"}',
            "cand: {source: hf, class: transformers.Qwen2ForCausalLM, pretrained: weights/qwen}",
        ),
        (":4: models.cand.pretrained: ", "weights/qwen is not a directory (only local models are loaded)"),
    ),
]
