"""``@pytest.mark.align(...)`` arguments are validated like the YAML: a wrong one is a single
usage-error line naming the marker, the argument and the allowed values, never a traceback."""

from __future__ import annotations

import pytest

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
    "tolerances-type": ("tolerances=3", "@pytest.mark.align(tolerances=...): expected a table name, a tolerance YAML file or a list of rules"),
    "unknown-key": ("recrod='tensor'", "@pytest.mark.align got unknown argument 'recrod' (allowed: tolerances, phases, record, mapping)"),
    "tolerances-file": ('tolerances="tol.yaml"', "@pytest.mark.align(tolerances='tol.yaml'): file not found: "),
    "mapping": ('mapping="maps/m.yml"', "@pytest.mark.align(mapping='maps/m.yml'): no such mapping file "),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_a_wrong_marker_argument_is_one_usage_error_line(
    pytester: pytest.Pytester, run_pytest: RunPytest, name: str
) -> None:
    args, expected = CASES[name]
    pytester.makepyfile(nets="import torch\n\ndef build():\n    return torch.nn.Embedding(4, 2)\n")
    pytester.makefile(".yaml", align=CONFIG)
    pytester.makepyfile(test_port=TEST.format(args=args))
    result = run_pytest("--align-config", "align.yaml", "test_port.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1, result.stderr.lines
    assert errors[0].startswith("ERROR: test_port.py::test_port: "), errors[0]
    assert expected in errors[0]
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


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
