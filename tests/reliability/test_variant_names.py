"""Variant folders are ``DIR/<case>@<label>/``: a case name holding ``@`` would share that
name space (``record --variant x --overwrite`` of case ``c`` replaced case ``c@x``'s baseline),
so ``@`` is refused in case names, with one message naming the file, the line and the key.
Stored variants stay readable as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.baseline.variants import recorded_variants, variant_dir
from pytest_precalign.cli import main
from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError

CONFIG = """\
version: 1
models:
  base: {source: factory, factory: "tiny_models:build"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 3, vocab_size: 4}
cases:
  - name: c
    baseline: base
    candidate: base
    inputs: toks
  - name: NAME
    baseline: base
    candidate: base
    inputs: toks
"""


@pytest.mark.parametrize("name", ["c@x", "@x", "c@", "a@b@c"])
def test_a_case_name_with_the_variant_separator_is_refused(tmp_path: Path, name: str) -> None:
    file = tmp_path / "align.yaml"
    with pytest.raises(ConfigError) as excinfo:
        load_config(CONFIG.replace("NAME", repr(name)), file)
    message = str(excinfo.value)
    assert message.startswith(f"{file.resolve()}:11: cases[1].name: {name!r} is not a usable case name")
    assert "'@'" in message and "<case>@<label>" in message and "\n" not in message


def test_validate_says_it_in_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "align.yaml"
    file.write_text(CONFIG.replace("NAME", "c@x"))
    assert main(["validate", str(file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("precalign: error: ") and "cases[1].name: 'c@x'" in err and "\n" not in err


def test_stored_variants_stay_readable(tmp_path: Path) -> None:
    for folder in (variant_dir(tmp_path, "c"), variant_dir(tmp_path, "c", "x"), tmp_path / "d"):
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
    assert recorded_variants(tmp_path, "c") == [("", tmp_path / "c"), ("x", tmp_path / "c@x")]
    assert recorded_variants(tmp_path, "d") == [("", tmp_path / "d")]
