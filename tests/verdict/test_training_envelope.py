"""The envelope lane's arithmetic (verdict/training_envelope.py + judge_run): the spread of a
scalar at a step is its largest |rerun - baseline|; the candidate may differ by factor x that
spread, never less than the floor (the table's bound, or a relative floor); ``steps_over``
forgives that many steps; the evidence quotes the envelope."""

from __future__ import annotations

from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable
from pytest_precalign.reports.envelope_text import envelope_text
from pytest_precalign.reports.training_evidence_text import evidence_text
from pytest_precalign.specs.envelope import EnvelopeSpec
from pytest_precalign.trace.step_scalars import StepScalars
from pytest_precalign.trace.training_record import RunRecord
from pytest_precalign.verdict.training_envelope import measure_envelope
from pytest_precalign.verdict.training_run import judge_run

TABLE = ToleranceTable("loose", (ToleranceRule(atol=1e-5, rtol=1e-4),))


def _run(grad_norms: list[float]) -> dict[int, StepScalars]:
    return {s: StepScalars(s, loss=2.0, grad_norm=g, param_norm=10.0) for s, g in enumerate(grad_norms)}


BASE = _run([1.0, 1.0, 1.0, 1.0])
RERUNS = [_run([1.0, 1.0 + 1e-6, 1.0 - 3e-6, 1.0]), _run([1.0, 1.0, 1.0 + 2e-6, 1.0])]


def test_the_spread_is_the_largest_rerun_difference_per_step() -> None:
    envelope = measure_envelope(BASE, RERUNS, EnvelopeSpec(reruns=2))
    spreads = envelope.spreads["grad_norm"]
    assert spreads[0] == 0.0 and spreads[3] == 0.0
    assert abs(spreads[1] - 1e-6) < 1e-12 and abs(spreads[2] - 3e-6) < 1e-12
    assert envelope.spreads["loss"] == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}


def _verdict(cand: list[float], spec: EnvelopeSpec):  # type: ignore[no-untyped-def]
    envelope = measure_envelope(BASE, RERUNS, spec)
    return judge_run(RunRecord(scalars=BASE), RunRecord(scalars=_run(cand)), {}, TABLE, envelope=envelope)


def test_within_factor_times_the_spread_passes_and_beyond_it_fails() -> None:
    spec = EnvelopeSpec(reruns=2, factor=4.0, floor=1e-7)
    assert _verdict([1.0, 1.0, 1.0 + 1.1e-5, 1.0], spec).passed  # 4 x 3e-6 = 1.2e-5 at step 2
    failed = _verdict([1.0, 1.0 + 5e-6, 1.0, 1.0], spec)  # 4 x 1e-6 = 4e-6 at step 1
    assert not failed.passed and failed.first is not None and failed.lane == "envelope"
    assert (failed.first.step, failed.first.origin) == (1, "grad_norm")
    assert "noise envelope: grad_norm spread 1e-06 over 2 clean rerun(s) of the baseline, allowed 4e-06" in (
        evidence_text(failed.first.evidence)
    )


def test_the_floor_is_the_table_unless_given() -> None:
    # step 3: spread 0; 5e-5 is inside the table's 1e-5 + 1e-4 x 1.0, outside a 1e-6 floor
    assert _verdict([1.0, 1.0, 1.0, 1.0 + 5e-5], EnvelopeSpec(reruns=2)).passed
    tight = _verdict([1.0, 1.0, 1.0, 1.0 + 5e-5], EnvelopeSpec(reruns=2, floor=1e-6))
    assert not tight.passed and tight.first is not None and tight.first.step == 3


def test_steps_over_forgives_that_many_steps() -> None:
    cand = [1.0 + 1e-3, 1.0, 1.0, 1.0 + 1e-3]
    assert not _verdict(cand, EnvelopeSpec(reruns=2, steps_over=1)).passed
    allowed = _verdict(cand, EnvelopeSpec(reruns=2, steps_over=2))
    assert allowed.passed and allowed.envelope is not None
    assert (allowed.envelope.reruns, allowed.envelope.over, allowed.envelope.allowed) == (2, (0, 3), 2)
    assert "steps over it: 0, 3 (steps_over allows 2)" in envelope_text(allowed.envelope)
