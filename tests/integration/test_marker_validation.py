"""``@pytest.mark.align(...)`` arguments are validated like the YAML: a wrong one is a single
usage-error line naming the marker, the argument and the allowed values, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

# The plugin's report header imports torch: imported here, before any in-process run, it stays
# loaded (pytester restores sys.modules after each run, and torch cannot be imported twice).
import torch  # noqa: F401

from pytest_precalign.align_runner import AlignRunner
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.errors import ConfigError
from tests.helpers.runs import RunPytest

CONFIG = """
version: 1
models:
  ref: {source: factory, factory: "nets:build"}
inputs:
  toks: {kind: tokens, batch: 1, seq_len: 2, vocab_size: 4, seed: 0}
tolerances:
  tight:
    - {match: "*", atol: 1.0e-6, rtol: 1.0e-5, why: "fp32"}
cases:
  - {name: same, baseline: ref, candidate: ref, inputs: toks}
"""

TEST = """
import pytest

@pytest.mark.align({args})
def test_port(align_runner):
    pass
"""

CASES = {
    "record": ('record="tensors"', "@pytest.mark.align(record='tensors'): unknown record mode (allowed: stats, tensor, hash)"),
    "phases": ('phases=["forwad"]', "@pytest.mark.align(phases=['forwad']): unknown phase 'forwad' (allowed: forward, backward, step)"),
    "phases-type": ('phases="forward"', "@pytest.mark.align(phases='forward'): expected a list of phases (allowed: forward, backward, step)"),
    "tolerances-name": ('tolerances="tigth"', "@pytest.mark.align(tolerances='tigth'): unknown table (known in align.yaml: tight; or a tolerance YAML file or a list of rules)"),
    "tolerances-rule": ('tolerances=[{"match": "*", "atl": 1e-6}]', "unknown key 'atl'"),
    "tolerances-type": ("tolerances=3", "@pytest.mark.align(tolerances=3): expected a table name, a tolerance YAML file or a list of rules, got int 3"),
    "unknown-key": ("recrod='tensor'", "@pytest.mark.align got unknown argument 'recrod' (allowed: tolerances, phases, record, mapping)"),
    "tolerances-file": ('tolerances="tol.yaml"', "@pytest.mark.align(tolerances='tol.yaml'): file not found: "),
    "mapping": ('mapping="maps/m.yml"', "@pytest.mark.align(mapping='maps/m.yml'): no such mapping file "),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_each_wrong_marker_argument_names_the_marker_the_argument_and_the_allowed(
    tmp_path: Path, name: str
) -> None:
    """The message for every wrong argument, from the plugin's own marker check (in process: the
    check runs at collection, before any model is built; the run below shows it reaches the user
    as one usage-error line)."""
    args, expected = CASES[name]
    (tmp_path / "align.yaml").write_text(CONFIG, encoding="utf-8")
    config = load_config_file(tmp_path / "align.yaml")
    marker = eval(f"pytest.mark.align({args})").mark  # the argument text exactly as in TEST

    def fail(outcome: object) -> None:
        raise AssertionError(outcome)

    with pytest.raises(ConfigError) as excinfo:
        AlignRunner.from_marker(config, marker, "test_port.py::test_port", fail, tmp_path)
    assert str(excinfo.value).startswith("test_port.py::test_port: "), str(excinfo.value)
    assert expected in str(excinfo.value)


@pytest.mark.xdist_twin("a worker hands the usage error to the controller")
@pytest.mark.parametrize("name", ["phases", "unknown-key"])
def test_a_wrong_marker_argument_is_one_usage_error_line(
    pytester: pytest.Pytester, plugin_args: list[str], name: str
) -> None:
    """Serially and with -n 2 (the workers hand the error to the controller): one ``ERROR:``
    line on stderr, exit code 4, no traceback. In process: the run stops at collection, before
    anything imports torch."""
    args, expected = CASES[name]
    pytester.makepyfile(nets="import torch\n\ndef build():\n    return torch.nn.Embedding(4, 2)\n")
    pytester.makefile(".yaml", align=CONFIG)
    pytester.makepyfile(test_port=TEST.format(args=args))
    basetemp = f"--basetemp={pytester.path / 'bt'}"
    result = pytester.runpytest_inprocess(
        "--align-config", "align.yaml", "test_port.py", "-p", "no:cacheprovider", basetemp, *plugin_args
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert len(errors) == 1, result.errlines
    assert errors[0].startswith("ERROR: test_port.py::test_port: "), errors[0]
    assert expected in errors[0]
    assert "Traceback" not in "\n".join(result.outlines + result.errlines)


def test_a_valid_marker_runs(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        test_ok="""
        import pytest
        import torch

        @pytest.mark.align(record="stats", phases=["forward"], tolerances=[{"match": "*", "atol": 0.0, "rtol": 0.0, "why": "same"}])
        def test_same(align_runner):
            torch.manual_seed(0); a = torch.nn.Linear(3, 3)
            run = align_runner.check(a, a, {"input": torch.ones(1, 3)})
            align_runner.assert_aligned(run)
        """
    )
    run_pytest().assert_outcomes(passed=1)
