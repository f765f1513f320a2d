"""YAML as people write it: numbers in YAML 1.2 form (``1e-5``) are numbers in every file the
tool reads (align config, tolerance tables), not strings refused as such."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config, load_config_file
from pytest_precalign.errors import ConfigError
from pytest_precalign.yaml_reader import load_yaml, read_yaml_file

CONFIG = """\
version: 1
models:
  base: {source: factory, factory: "tiny_models:build"}
  cand: {source: factory, factory: "tiny_models:build"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 3, vocab_size: 4}
tolerances:
  fp32:
    - {match: "*", ATOL}
cases:
  - name: c1
    baseline: base
    candidate: cand
    inputs: toks
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1e-5", 1e-5),
        ("1E-5", 1e-5),
        ("-1e+3", -1000.0),
        ("+2e3", 2000.0),
        ("1.5e-3", 1.5e-3),
        (".5e-3", 5e-4),
        ("1.0e-5", 1e-5),
        (".inf", math.inf),
        ("-.inf", -math.inf),
    ],
)
def test_yaml_12_floats_are_numbers(text: str, expected: float) -> None:
    value = load_yaml(f"x: {text}\n", "t.yaml")["x"]
    assert isinstance(value, float)
    assert value == expected


def test_yaml_nan_is_a_number_and_other_scalars_keep_their_type() -> None:
    data = load_yaml('n: .nan\ni: 12\ns: "1e-5"\nw: 1e5x\nv: v1e5\n', "t.yaml")
    assert math.isnan(data["n"])
    assert data["i"] == 12 and isinstance(data["i"], int)
    assert (data["s"], data["w"], data["v"]) == ("1e-5", "1e5x", "v1e5")


def test_yaml_12_floats_in_a_file(tmp_path: Path) -> None:
    file = tmp_path / "t.yaml"
    file.write_text("atol: 1E-5\n", encoding="utf-8")
    assert read_yaml_file(file) == {"atol": 1e-5}


@pytest.mark.parametrize("atol", ["1e-5", "1E-5"])
def test_config_tolerance_in_exponent_form(tmp_path: Path, atol: str) -> None:
    text = CONFIG.replace("ATOL", f"atol: {atol}, rtol: 1e-4, cosine: 0.99")
    rule = load_config(text, tmp_path / "align.yaml").tolerances["fp32"].rules[0]
    assert (rule.atol, rule.rtol) == (1e-5, 1e-4)
    assert dict(rule.bounds)["cosine"] == 0.99


def test_tolerance_file_in_exponent_form(tmp_path: Path) -> None:
    (tmp_path / "fp32.yaml").write_text("rules:\n  - {atol: 1e-5, rtol: 2E-4}\n", encoding="utf-8")
    text = CONFIG.replace('\n    - {match: "*", ATOL}', " fp32.yaml")
    (tmp_path / "align.yaml").write_text(text, encoding="utf-8")
    rule = load_config_file(tmp_path / "align.yaml").tolerances["fp32"].rules[0]
    assert (rule.atol, rule.rtol) == (1e-5, 2e-4)


def test_negative_exponent_form_is_still_checked(tmp_path: Path) -> None:
    text = CONFIG.replace("ATOL", "atol: -1e+3, rtol: 0")
    with pytest.raises(ConfigError) as excinfo:
        load_config(text, tmp_path / "align.yaml")
    assert str(excinfo.value).endswith("tolerances.fp32[0].atol: must be >= 0, got -1000.0")
