"""The plugin end to end: items, verdicts in the terminal and report.json, options, the
align_runner fixture and usage errors; the inner pytest runs serially, and with ``-n 2`` where xdist matters (``xdist_twin``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.nets import MLP_NETS, write_mlp_suite
from tests.helpers.runs import ExampleSuite, RunPytest


def _suite(pytester: pytest.Pytester, bug: str = "null", mode: str = "tensor") -> Path:
    return write_mlp_suite(pytester.path, bug=bug, mode=mode)


def _report(pytester: pytest.Pytester) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((pytester.path / "out" / "report.json").read_text())
    return data


def test_example_suite_passes_and_finds_the_known_bug(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    folder = example_suite("qwen2_hf_attention")
    result = run_pytest("--align-config", str(folder / "align.yaml"), str(folder), "--align-report", "out")
    result.assert_outcomes(passed=5)
    # Under -n 2 the two cases finish in either order: each line is matched after the header.
    for line in (
        "PASSED eager_vs_sdpa[[]forward[]]*aligned*",
        "PASSED known_mlp_bug[[]forward[]]*first divergence model.layers.1.mlp*origin*found the expected*",
        "PASSED known_mlp_bug[[]backward[]]*downstream of model.layers.1.mlp (forward)*",
    ):
        result.stdout.fnmatch_lines(["*= precalign =*", line])
    cases = {(c["name"], c["phase"]): c for c in _report(pytester)["cases"]}
    assert set(cases) == {
        ("eager_vs_sdpa", "forward"),
        ("eager_vs_sdpa", "backward"),
        ("eager_vs_sdpa", "step"),
        ("known_mlp_bug", "forward"),
        ("known_mlp_bug", "backward"),
    }
    assert cases["eager_vs_sdpa", "forward"]["first_divergence"] is None
    assert cases["eager_vs_sdpa", "step"]["passed"] is True
    first = cases["known_mlp_bug", "forward"]["first_divergence"]
    assert (first["name"], first["origin"], first["phase"], first["kind"]) == (
        "model.layers.1.mlp",
        True,
        "forward",
        "activation",
    )
    assert first["value"] > first["allowed"] > 0
    assert cases["known_mlp_bug", "backward"]["origin"]["module"] == "model.layers.1.mlp"


def test_items_are_named_by_case_and_phase(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    _suite(pytester)
    result = run_pytest("--align-config", "align.yaml", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        ["align.yaml::port[[]forward[]]", "align.yaml::port[[]backward[]]", "align.yaml::port[[]step[]]"]
    )


@pytest.mark.parametrize("mode", ["tensor", "stats"])
def test_aligned_candidate_passes(pytester: pytest.Pytester, run_pytest: RunPytest, mode: str) -> None:
    _suite(pytester, mode=mode)
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out")
    result.assert_outcomes(passed=3)
    assert all(c["passed"] and c["first_divergence"] is None for c in _report(pytester)["cases"])


@pytest.mark.xdist_twin("report.json entries merged from the workers")
@pytest.mark.parametrize("mode", ["tensor", "stats"])
def test_bug_in_a_blocks_own_code_is_named_as_origin(
    pytester: pytest.Pytester, run_pytest: RunPytest, mode: str
) -> None:
    _suite(pytester, bug="own", mode=mode)
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out")
    result.assert_outcomes(failed=3)
    # One entry per item: under -n 2 the controller merged the workers' entries.
    report_cases = _report(pytester)["cases"]
    assert sorted(c["phase"] for c in report_cases) == ["backward", "forward", "step"]
    cases = {c["phase"]: c for c in report_cases}
    first = cases["forward"]["first_divergence"]
    assert (first["name"], first["origin"], first["kind"]) == ("blocks.1", True, "activation")
    assert first["value"] > first["allowed"]
    assert first["evidence"] == ("tensor" if mode == "tensor" else "stats")
    text = result.stdout.str()
    assert "First divergence: blocks.1 (activation, out, step 0), origin: its inputs matched" in text
    assert "fp32 same-code budget" in text
    assert 'To reproduce: pytest --align-config align.yaml "align.yaml::port[forward]"' in text
    assert "Traceback" not in text
    result.stdout.fnmatch_lines(["*FAILED port[[]forward[]]*first divergence blocks.1*"])
    if mode == "stats":
        assert "evidence is statistical" in text
    else:
        assert "Mismatched elements:" in text and "Greatest absolute difference:" in text


def test_bug_between_submodules_is_propagated_into_the_parent(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    _suite(pytester, bug="between")
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out")
    result.assert_outcomes(failed=3)
    first = {c["phase"]: c for c in _report(pytester)["cases"]}["forward"]["first_divergence"]
    assert (first["name"], first["origin"], first["origin_module"]) == ("blocks.1.up", False, "blocks.1")
    result.stdout.fnmatch_lines(["*First divergence: blocks.1.up*propagated*enters in blocks.1*"])


def test_expectation_that_does_not_hold_fails(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    _suite(pytester, bug="own")
    text = (
        (pytester.path / "align.yaml")
        .read_text()
        .replace(
            "tolerances: tight}", "tolerances: tight, expect: {first_divergence: blocks.2, origin: true}}"
        )
    )
    (pytester.path / "align.yaml").write_text(text)
    result = run_pytest("--align-config", "align.yaml")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*Known divergence not reproduced: expected first divergence 'blocks.2' (origin: true)*found 'blocks.1'*"
        ]
    )


def test_plugin_is_inert_without_a_config(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    _suite(pytester)
    pytester.makepyfile(test_plain="def test_x():\n    assert 1 + 1 == 2\n")
    result = run_pytest("-v")
    result.assert_outcomes(passed=1)  # align.yaml in the folder is not collected
    text = result.stdout.str()
    assert "precalign:" not in text and "= precalign =" not in text


def test_report_header_and_ini_option(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    _suite(pytester)
    pytester.makeini("[pytest]\nalign_config = align.yaml\n")
    result = run_pytest()
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "precalign: config *align.yaml, 1 case(s); torch *, device cpu, dtype float32, seed 0, deterministic True"
        ]
    )


def test_config_outside_the_given_paths_is_still_collected(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    _suite(pytester)
    (pytester.path / "sub").mkdir()
    pytester.makepyfile(**{"sub/test_a": "def test_a():\n    pass\n"})
    result = run_pytest("--align-config", "align.yaml", "sub")
    result.assert_outcomes(passed=4)


def test_align_runner_fixture_and_marker(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(nets=MLP_NETS)
    pytester.makepyfile(
        test_port="""
        import pytest
        import torch
        from pytest_precalign import AlignmentMismatch
        import nets

        @pytest.mark.align(phases=["forward", "backward"],
                           tolerances=[{"match": "*", "atol": 1e-6, "rtol": 1e-5, "why": "inline"}])
        def test_same(align_runner):
            torch.manual_seed(0); a = nets.Net()
            torch.manual_seed(0); b = nets.Net()
            ids = torch.randint(0, 50, (2, 5))
            run = align_runner.check(a, b, {"input_ids": ids}, labels=ids)
            assert run.verdicts["backward"].compared > 0

        @pytest.mark.align(phases=["forward"])
        def test_bug(align_runner):
            torch.manual_seed(0); a = nets.Net()
            b = nets.Net(bug="own")
            ids = torch.randint(0, 50, (2, 5))
            # check() is the assertion (as pytest-regressions' check): it fails the test
            with pytest.raises(AlignmentMismatch, match="First divergence: blocks.1 "):
                align_runner.check(a, b, {"input_ids": ids}, sync_weights=True)
            run = align_runner.compare(a, b, {"input_ids": ids}, sync_weights=True)
            assert not run.verdicts["forward"].passed and run.verdicts["forward"].first.origin
            with pytest.raises(AlignmentMismatch, match="First divergence: blocks.1 "):
                align_runner.assert_aligned(run)
    """
    )
    result = run_pytest()
    result.assert_outcomes(passed=2)


@pytest.mark.xdist_twin("a case's phase items scheduled on one worker")
def test_saved_traces_are_readable_and_never_overwritten(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    # Under -n 2 this also checks that a case's three phase items ran on one worker: a second
    # worker running the case would refuse to overwrite the first one's traces.
    from pytest_precalign.trace.native_io import read_trace

    _suite(pytester)
    result = run_pytest("--align-config", "align.yaml", "--align-save-traces", "traces")
    result.assert_outcomes(passed=3)
    trace = read_trace(pytester.path / "traces" / "align" / "port" / "candidate")
    assert trace.manifest["side"] == "candidate" and trace.manifest["versions"]["torch"]
    assert any(r.kind == "param" for r in trace.records)
    again = run_pytest("--align-config", "align.yaml", "--align-save-traces", "traces")
    again.assert_outcomes(failed=3)
    again.stdout.fnmatch_lines(["*a trace already exists there; refusing to overwrite it*"])


def test_npu_device_without_torch_npu_is_a_usage_error(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    _suite(pytester)
    text = (
        (pytester.path / "align.yaml")
        .read_text()
        .replace("version: 1", "version: 1\ndefaults: {device: npu}")
    )
    (pytester.path / "align.yaml").write_text(text)
    result = run_pytest("--align-config", "align.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --align-config: case 'port': *align.yaml:*: models.ref: device 'npu' needs torch_npu, which is not installed:"
            " pip install 'pytest-precalign[[]npu[]]'*"
        ]
    )
    assert "Traceback" not in result.stderr.str()


def test_model_that_cannot_take_the_inputs_is_a_clear_case_error(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        seq="import torch\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Embedding(20, 4))\n"
    )
    pytester.makefile(
        ".yaml",
        align="""
version: 1
models:
  a: {source: factory, factory: "seq:build"}
inputs:
  t: {kind: tokens, vocab_size: 20}
cases:
  - {name: c, baseline: a, candidate: a, inputs: t}
""",
    )
    result = run_pytest("--align-config", "align.yaml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*model 'a' cannot be called as model(**inputs) with inputs input_ids: *unexpected keyword argument 'input_ids'*"
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_msprobe_dump_example_suite_gates_the_known_divergence(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    folder = example_suite("msprobe_dumps")
    result = run_pytest("--align-config", str(folder / "align.yaml"), str(folder), "--align-report", "out")
    result.assert_outcomes(passed=6)
    cases = {(c["name"], c["phase"]): c for c in _report(pytester)["cases"]}
    for name, evidence in (("tensor_dumps", "tensor"), ("statistics_dumps", "stats"), ("md5_dumps", "hash")):
        first = cases[name, "forward"]["first_divergence"]
        assert (first["name"], first["origin"], first["evidence"]) == (
            "model.layers.0.mlp.down_proj",
            True,
            evidence,
        )


def test_bad_dump_in_a_case_is_a_usage_error(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    (pytester.path / "empty").mkdir()
    pytester.makefile(
        ".yaml",
        align="""
version: 1
cases:
  - {name: d, baseline: {dump: empty}, candidate: {dump: empty}}
""",
    )
    result = run_pytest("--align-config", "align.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --align-config: case 'd': *empty: neither a pytest-precalign trace*"]
    )
    assert "Traceback" not in result.stderr.str()
