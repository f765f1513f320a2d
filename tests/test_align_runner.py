"""``@pytest.mark.align`` / ``align_runner`` arguments: a tolerance table name, a tolerance
file or a mapping that cannot be used is one ConfigError naming the test, the argument and what
is allowed (the plugin turns it into a UsageError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.align_runner import AlignRunner
from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError
from pytest_precalign.reports.outcome import ItemOutcome

CONFIG = """\
version: 1
models:
  base: {source: factory, factory: "tiny_models:build"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 3, vocab_size: 4}
tolerances:
  fp32: [{match: "*", atol: 1e-5, rtol: 0, why: "config table"}]
mappings:
  m: {renames: [{baseline: a, candidate: b}]}
cases: []
"""


def _fail(outcome: ItemOutcome) -> None:
    raise AssertionError(outcome.message)


def _runner(tmp_path: Path, with_config: bool = False, **kwargs: object) -> AlignRunner:
    config = load_config(CONFIG, tmp_path / "align.yaml") if with_config else None
    marker = pytest.mark.align(**kwargs).mark
    return AlignRunner.from_marker(config, marker, "test_x.py::test_x", _fail, tmp_path)


def test_table_name_without_a_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        _runner(tmp_path, tolerances="fp32")
    assert str(excinfo.value) == (
        "test_x.py::test_x: @pytest.mark.align(tolerances='fp32'): a table name needs --align-config "
        "(the config whose tolerances: defines it); or give a tolerance YAML file or a list of rules"
    )


def test_table_name_from_the_config(tmp_path: Path) -> None:
    assert _runner(tmp_path, True, tolerances="fp32").tolerances.rules[0].why == "config table"
    with pytest.raises(ConfigError, match=r"unknown table \(known in align.yaml: fp32; or a tolerance"):
        _runner(tmp_path, True, tolerances="bf16")


def test_tolerance_file_relative_to_the_test(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("- {atol: 1e-4, rtol: 1E-3, why: file}\n", encoding="utf-8")
    rule = _runner(tmp_path, tolerances="t.yaml").tolerances.rules[0]
    assert (rule.atol, rule.rtol, rule.why) == (1e-4, 1e-3, "file")
    with pytest.raises(ConfigError, match=r"tolerances='nope.yaml'\): file not found: .*nope.yaml$"):
        _runner(tmp_path, tolerances="nope.yaml")


@pytest.mark.parametrize(
    ("mapping", "fragment"),
    [
        ("nope.yaml", "no such mapping file"),
        ("m2", "no such mapping file"),
        (
            "preset:nope",
            "unknown preset mapping 'preset:nope' (allowed: preset:megatron-qwen2.5, preset:megatron-llama, preset:megatron-qwen3, "
            "preset:megatron-mixtral, preset:megatron-qwen3-moe)",
        ),
        (3, "expected a MappingSpec, a mapping name, preset:NAME or a YAML file path"),
    ],
)
def test_bad_marker_mapping_is_a_clear_error(tmp_path: Path, mapping: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        _runner(tmp_path, mapping=mapping)
    message = str(excinfo.value)
    assert message.startswith(f"test_x.py::test_x: @pytest.mark.align(mapping={mapping!r}): ")
    assert fragment in message


def test_marker_mapping_kinds_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("renames: [{baseline: a, candidate: b}]\n", encoding="utf-8")
    assert _runner(tmp_path, mapping="m.yaml").mapping == "m.yaml"
    assert _runner(tmp_path, mapping="preset:megatron-qwen2.5").mapping == "preset:megatron-qwen2.5"
    assert _runner(tmp_path, True, mapping="m").mapping == "m"


def test_check_fails_the_test_and_compare_returns_the_run(tmp_path: Path) -> None:
    """``check`` is the assertion (as pytest-regressions' ``check``); ``compare`` asserts nothing."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)  # other weights: diverge at once
    runner = _runner(tmp_path)
    inputs = {"input": torch.ones(1, 3)}
    with pytest.raises(AssertionError, match="First divergence"):
        runner.check(a, b, inputs)
    run = runner.compare(a, b, inputs)
    assert not run.verdicts["forward"].passed
    assert runner.check(a, a, inputs).verdicts["forward"].passed


def test_the_api_types_are_exported() -> None:
    import pytest_precalign
    from pytest_precalign.compare.tolerances import ToleranceTable
    from pytest_precalign.mapping.spec import MappingSpec
    from pytest_precalign.run.outcome import CaseRun

    exported = (pytest_precalign.AlignRunner, pytest_precalign.CaseRun)
    assert exported == (AlignRunner, CaseRun)
    assert (pytest_precalign.ToleranceTable, pytest_precalign.MappingSpec) == (ToleranceTable, MappingSpec)
