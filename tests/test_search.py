"""Divergence search (case key ``search:``): hypothesis finds a length-dependent bug and
shrinks it to the minimal example, printed as a paste-able ``inputs:`` block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError

# A candidate whose attention mask is wrong only for query positions >= 16: from there on
# it cannot see position 0 (as if a 16-token sliding window had leaked into full attention).
MASK_BUG = """
import torch


def patch(model):
    for layer in model.model.layers:
        attn = layer.self_attn
        original = attn.forward

        def forward(*args, attention_mask=None, _original=original, **kwargs):
            if attention_mask is not None and attention_mask.shape[-2] > 16:
                attention_mask = attention_mask.clone()
                attention_mask[..., 16:, 0] = torch.finfo(attention_mask.dtype).min
            return _original(*args, attention_mask=attention_mask, **kwargs)

        attn.forward = forward
    return model
"""

QWEN = (
    "{source: hf, class: transformers.Qwen2ForCausalLM, attn_implementation: eager, "
    "config: {vocab_size: 64, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, "
    "num_attention_heads: 2, num_key_value_heads: 1}"
)

CONFIG = f"""\
version: 1
models:
  base: {QWEN}}}
  cand: {QWEN}, patch: "mask_bug:patch"}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 12, vocab_size: 64, labels: true}}
cases:
  - name: window
    baseline: base
    candidate: cand
    inputs: toks
    search: {{max_examples: 25, batch: [1, 2], seq_len: [1, 24]}}
"""


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny models run many small ops: one thread each is faster on a shared 2-core machine
    (pytester's subprocesses inherit it)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _write(pytester: pytest.Pytester, text: str) -> None:
    pytester.makepyfile(mask_bug=MASK_BUG)
    (pytester.path / "align.yaml").write_text(text, encoding="utf-8")


def _run(pytester: pytest.Pytester, text: str, *args: str) -> pytest.RunResult:
    _write(pytester, text)
    return pytester.runpytest(
        "--align-config", "align.yaml", "-p", "no:cacheprovider", "-p", "no:xdist", *args
    )


def _pasted(config: str, block: str, name: str) -> str:
    """The config with the printed block's input added and the case pointed at it."""
    entry = block.split("\n", 1)[1]  # drop the "inputs:" line: the config has one
    text = config.replace("inputs:\n", "inputs:\n" + entry + "\n", 1)
    text = text.replace("    inputs: toks\n", f"    inputs: {name}\n")
    return re.sub(r"    search: .*\n", "", text)


def test_search_shrinks_a_length_dependent_bug_to_seq_len_17(pytester: pytest.Pytester) -> None:
    result = _run(pytester, CONFIG)
    # The fixed inputs (seq_len 12) never reach position 16: forward passes, the search fails.
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "Traceback" not in text
    assert "Divergence search: case 'window' diverges in forward; minimal example after" in text
    assert "batch 1, seq_len 17\n" in text
    assert "First divergent layer of the minimal example: model.layers.0.self_attn" in text
    match = re.search(r"\ninputs:\n  window_minimal:\n(    .*\n)+", text)
    assert match, text
    block = match.group(0).strip("\n")
    assert "    kind: ids\n" in block and "    labels: true" in block
    ids = re.search(r"input_ids: (\[\[.*\]\])", block)
    assert ids is not None
    rows = [[int(v) for v in row.split(",")] for row in re.findall(r"\[([\d, ]+)\]", ids.group(1))]
    assert [len(r) for r in rows] == [17]
    assert set(rows[0]) == {0}  # shrunk to the simplest tokens: the attention weights still differ

    # Pasted back as the case's inputs, the minimal example diverges at the same layer; its
    # first 16 tokens (a second case, same run) do not: the bug needs position 16.
    pasted = _pasted(CONFIG, block, "window_minimal")
    first16 = "[[" + ", ".join(str(v) for v in rows[0][:16]) + "]]"
    pasted = pasted.replace(
        "inputs:\n", f"inputs:\n  first16: {{kind: ids, input_ids: {first16}, labels: true}}\n", 1
    )
    pasted += "  - {name: window16, baseline: base, candidate: cand, inputs: first16}\n"
    again = _run(pytester, pasted)
    again.assert_outcomes(passed=1, failed=1)
    out = again.stdout.str()
    assert "FAILED align.yaml::window[forward]" in out
    assert "First divergence: model.layers.0.self_attn" in out
    assert "PASSED window16[forward]" in out


def test_search_of_an_aligned_pair_passes(pytester: pytest.Pytester) -> None:
    text = CONFIG.replace(', patch: "mask_bug:patch"', "").replace(
        "max_examples: 25, batch: [1, 2], seq_len: [1, 24]}",
        "max_examples: 10, batch: [1, 2], seq_len: [1, 24], padding: true}",
    )
    result = _run(pytester, text, "-rA")
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("search", "fragment"),
    [
        ("{max_examples: 0}", "cases[0].search.max_examples: must be >= 1, got 0"),
        ("{seq_len: [8, 4]}", "cases[0].search.seq_len: expected 1 <= min <= max, got [8, 4]"),
        ("{batch: [1, 2, 3]}", "cases[0].search.batch: expected [min, max] (two integers) or one integer"),
        ("{seq_len: 1, padding: true}", "cases[0].search.padding: padding needs seq_len of at least 2"),
        ("{shrink: false}", "cases[0].search.shrink: unknown key 'shrink'"),
        ("{vocab_size: 0}", "cases[0].search.vocab_size: must be >= 1, got 0"),
        ("[1, 2]", "cases[0].search: expected a mapping, got a list"),
    ],
)
def test_search_options_are_validated(tmp_path: Path, search: str, fragment: str) -> None:
    text = re.sub(r"search: .*", f"search: {search}", CONFIG)
    with pytest.raises(ConfigError) as excinfo:
        load_config(text, tmp_path / "align.yaml")
    assert fragment in str(excinfo.value)
    assert str(tmp_path / "align.yaml") in str(excinfo.value)


def test_search_needs_vocab_size_without_token_inputs(tmp_path: Path) -> None:
    text = CONFIG.replace(
        "{kind: tokens, batch: 2, seq_len: 12, vocab_size: 64, labels: true}",
        "{kind: ids, input_ids: [[1, 2]]}",
    )
    with pytest.raises(ConfigError, match=r"cases\[0\].search: missing required key 'vocab_size'"):
        load_config(text, tmp_path / "align.yaml")
    spec = load_config(
        text.replace("seq_len: [1, 24]}", "seq_len: [1, 24], vocab_size: 64}"), tmp_path / "a.yaml"
    )
    assert spec.cases[0].search is not None and spec.cases[0].search.vocab_size == 64


def test_cli_run_reports_the_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from pytest_precalign.cli import main

    (tmp_path / "mask_bug.py").write_text(MASK_BUG, encoding="utf-8")
    (tmp_path / "align.yaml").write_text(
        CONFIG.replace("max_examples: 25", "max_examples: 10"), encoding="utf-8"
    )
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(["run", str(tmp_path / "align.yaml")])
    finally:
        torch.set_num_threads(threads)
        sys.modules.pop("mask_bug", None)
    out = capsys.readouterr().out
    assert code == 1
    assert "PASSED window[forward]" in out
    assert "FAILED window[search]" in out
    assert "  inputs:\n    window_minimal:\n      kind: ids\n" in out
