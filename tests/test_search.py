"""Divergence search (case key ``search:``): hypothesis finds a length-dependent bug and
shrinks it to the minimal example, printed as a paste-able ``inputs:`` block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError
from tests.helpers.search_suite import CONFIG, MASK_BUG


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
