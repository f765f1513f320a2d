"""``precalign compare`` on a corpus of faults dumped by the real msprobe (tests/helpers/msprobe_faults.py).

The corpus is made once per session (two msprobe processes, each dumping the golden model and
half of the faults in every config) and shared by the xdist workers through a lock file. Each
fault's dump is compared with the golden dump of the *other* process, so golden vs golden is
two separate runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from pytest_precalign.reports.training_evidence_text import proof_text
from pytest_precalign.run.offline import compare_run_sets
from pytest_precalign.run.outcome import CaseRun
from pytest_precalign.verdict.phase import Divergence, PhaseVerdict
from tests.helpers.msprobe_faults import (
    FAULTS,
    MATRIX,
    MD5_L0,
    S_L0,
    S_MIX,
    T_L0,
    T_MIX,
    DumpConfig,
    Expected,
    dumps,
)

CASES = [(c, f) for c, faults in MATRIX.items() for f in faults]


def verdicts(runs: list[tuple[tuple[int, int], CaseRun]]) -> Iterator[tuple[int, PhaseVerdict]]:
    for (step, _rank), run in runs:
        for verdict in run.verdicts.values():
            yield step, verdict


def _encloses(outer: str, inner: str) -> bool:
    return outer == inner or inner.startswith(outer + ".")


def check_module_divergence(first: Divergence, want: Expected) -> None:
    """Modules (L0, mix): the right layer, origin or the module it enters in. With statistics
    only, a change too small for the tolerance can hide; then the verdict may name a later
    layer, but must not call it the origin, and must name a module enclosing the true one."""
    true_origin = want.name if want.origin else want.origin_module
    if first.name == want.name:
        assert first.origin == want.origin
        if not want.origin:
            assert first.origin_module == want.origin_module
        return
    assert first.evidence == "stats", f"{first.name} named, {want.name} expected"
    assert not first.origin
    assert _encloses(first.origin_module, true_origin), (first.origin_module, true_origin)


@pytest.mark.parametrize("config", list(MATRIX), ids=lambda c: c.label)
def test_golden_runs_of_two_processes_align(corpus: Path, config: DumpConfig) -> None:
    golden_a = corpus / "a" / config.label / "golden"
    golden_b = corpus / "b" / config.label / "golden"
    found = list(verdicts(compare_run_sets(golden_a, golden_b)))
    assert {v.phase for _, v in found} == {"forward", "backward"}
    for _, verdict in found:
        assert verdict.aligned and verdict.first is None, verdict.phase
        assert verdict.compared > 0 and not verdict.only_baseline and not verdict.only_candidate
        assert verdict.overflow == () and verdict.nonfinite == ()  # masks of finfo.min are no overflow


@pytest.mark.parametrize(
    ("config", "fault"),
    [(c, f) for c, f in CASES if c.level != "L1"],
    ids=[f"{c.label}-{f}" for c, f in CASES if c.level != "L1"],
)
def test_fault_is_traced_to_its_origin(corpus: Path, config: DumpConfig, fault: str) -> None:
    want = FAULTS[fault].expected
    assert want is not None
    found = list(verdicts(compare_run_sets(*dumps(corpus, config, fault))))
    for step, verdict in found:
        earlier_phase = verdict.phase == "forward" and want.phase == "backward"
        if step < want.step or (step == want.step and earlier_phase):  # upstream of the fault
            assert verdict.aligned, (step, verdict.phase, verdict.first and verdict.first.name)
    target = next(v for s, v in found if s == want.step and v.phase == want.phase)
    first = target.first
    assert first is not None and not target.aligned
    assert first.step == want.step
    check_module_divergence(first, want)
    expected_evidence = {"statistics": "stats", "md5": "hash"}.get(config.summary, "stats")
    if config.task == "tensor":
        expected_evidence = "tensor"
    assert first.evidence == expected_evidence
    if config.level == "mix" and want.phase == "forward":
        assert first.first_op is not None  # the first diverging API call, as detail
    if want.overflow:
        assert target.overflow[0].record.name == want.name
        assert target.overflow[0].level == "critical"
    if want.dtype_note and first.evidence != "hash":
        other = first.pair.candidate
        assert other is not None and (other.dtype, first.pair.record.dtype) == ("bfloat16", "float32")


# L1 dumps hold API calls only: the first diverging call, by msprobe's name.
L1_EXPECTED = {
    # q_proj is the first linear of the step; its weight (an input of the call) differs
    "q_proj": ("Functional.linear", 0, "forward", False),
    "lm_head": ("Functional.linear", -1, "forward", False),  # -1: the last linear call
    # the attention scores times the (wrong) scale: inputs matched, output differs
    "softmax_scale": ("Tensor.__mul__", None, "forward", True),
    # sdpa: one fused call, given the wrong scale (a non-tensor argument)
    "softmax_scale_sdpa": ("Functional.scaled_dot_product_attention", 0, "forward", True),
    # gelu and silu are different calls (unmatched); the product act(gate) * up differs first
    "gelu": ("Tensor.__mul__", None, "forward", False),
    "grad_scale": ("Functional.linear", None, "backward", False),
}


@pytest.mark.parametrize(
    ("config", "fault"),
    [(c, f) for c, f in CASES if c.level == "L1"],
    ids=[f"{c.label}-{f}" for c, f in CASES if c.level == "L1"],
)
def test_api_only_dump_names_the_first_diverging_call(corpus: Path, config: DumpConfig, fault: str) -> None:
    name, call, phase, origin = L1_EXPECTED[fault]
    golden, run = dumps(corpus, config, fault)
    [(_, case)] = compare_run_sets(golden, run)
    first = case.verdicts[phase].first
    assert first is not None
    assert (first.name, first.origin) == (name, origin)
    assert first.pair.record.module_class == "api"
    if call is not None:
        calls = sorted({r.call for r in case.baseline.records if r.name == name})
        assert first.call == calls[call]
    if phase == "backward":
        assert case.verdicts["forward"].aligned
    if fault == "gelu":  # the calls only one side made, just before it: a hint, not the origin
        assert proof_text(first.proof).endswith(
            "only one side made just before it: "
            "Functional.silu.1.forward (baseline only) / Functional.gelu.0.forward (candidate only)"
        )
        assert "only" not in first.origin_module and not first.proven


def test_cli_names_layer_origin_and_statistical_evidence(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, run = dumps(corpus, S_L0, "rmsnorm_eps")
    assert main(["compare", str(golden), str(run)]) == 1
    out = capsys.readouterr().out
    assert "first divergence model.layers.1.input_layernorm (activation" in out
    assert "origin: its inputs matched, its output did not" in out
    assert "evidence is statistical (max/min/mean/norm), not element-wise" in out
    assert "Traceback" not in out


def test_cli_md5_names_the_first_differing_record(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, run = dumps(corpus, MD5_L0, "gelu")
    assert main(["compare", str(golden), str(run)]) == 1
    out = capsys.readouterr().out
    assert "First divergence: model.layers.1.mlp.act_fn (activation, out, step 0), origin" in out
    assert "crc32" in out


def test_cli_pairs_steps_of_dump_roots(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, run = dumps(corpus, T_MIX, "step1_weight")
    assert main(["compare", str(golden), str(run)]) == 1
    lines = capsys.readouterr().out.splitlines()
    summaries = [line for line in lines if line.startswith(("PASSED", "FAILED"))]
    assert [line.split()[0] for line in summaries] == ["PASSED", "PASSED", "FAILED", "FAILED"]
    assert "@step0" in summaries[0] and "@step1" in summaries[2]
    assert "first divergence model.layers.1.mlp.up_proj (activation" in summaries[2]


def test_cli_backward_only_fault(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, run = dumps(corpus, T_L0, "grad_scale")
    assert main(["compare", str(golden), str(run)]) == 1
    out = capsys.readouterr().out
    # msprobe dumps carry no manifest: the environment heading says so, then the verdicts
    heading, _, out = out.partition("\n")
    assert (
        heading
        == "environment: not compared (an msprobe dump carries no manifest: its environment was not recorded)"
    )
    assert out.startswith("PASSED")  # forward
    assert "first divergence model.layers.0.mlp.act_fn (grad_input" in out and ", origin)" in out


def test_cli_dtype_difference_names_the_lower_precision_layer(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, run = dumps(corpus, T_L0, "bf16_layer")
    assert main(["compare", str(golden), str(run)]) == 1
    out = capsys.readouterr().out
    assert "First divergence: model.layers.1.mlp.down_proj (activation, out, step 0), origin" in out
    assert "why this record: dtype bfloat16 (candidate) vs float32 (baseline)" in out


def test_cli_overflow_names_the_first_inf(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, run = dumps(corpus, S_MIX, "inf_output")
    assert main(["compare", str(golden), str(run)]) == 1
    out = capsys.readouterr().out
    assert "critical model.layers.0.mlp.down_proj" in " ".join(out.split())


def test_cli_l1_names_api_calls_like_msprobe(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = next(c for c in MATRIX if c.level == "L1" and "q_proj" in MATRIX[c])
    golden, run = dumps(corpus, config, "q_proj")
    assert main(["compare", str(golden), str(run)]) == 1
    out = capsys.readouterr().out
    assert "First divergence: Functional.linear.0.forward" in out
    assert "enters in its inputs, though no earlier recorded call failed (a parameter" in out
