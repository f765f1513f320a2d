"""What a failure message shows (issue #12): lower-bound metrics say ``<``, error indices are
multi-dimensional like torch.testing's, and the worst record shown is a gated (output) one."""

from __future__ import annotations

import torch

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable
from pytest_precalign.reports.text import PhaseReport, failure_message, summary_line, worst_metric
from pytest_precalign.trace.records import Record, Trace
from pytest_precalign.verdict.phase import PhaseVerdict, phase_verdict


def _rec(seq: int, name: str, kind: str, shape: tuple[int, ...], deps: tuple[str, ...] = ()) -> Record:
    return Record(
        seq=seq,
        name=name,
        module_class="M",
        phase="forward",
        step=0,
        call=0,
        kind=kind,
        slot="out",
        dtype="float32",
        shape=shape,
        tensor_key=f"t{seq}",
        deps=deps,
    )


def _verdict(
    table: ToleranceTable, base: dict[str, torch.Tensor], cand: dict[str, torch.Tensor]
) -> PhaseVerdict:
    """One module ``m``: its input, then its output."""
    shape = tuple(base["input"].shape)
    recs = (_rec(0, "m", "input", shape), _rec(1, "m", "activation", shape, deps=("m|input|out|0|0",)))

    def trace(values: dict[str, torch.Tensor]) -> Trace:
        return Trace({"record_mode": "tensor"}, recs, {r.tensor_key: values[r.kind] for r in recs})

    return phase_verdict(compare_traces(trace(base), trace(cand), table), "forward", None, False)


def _report(verdict: PhaseVerdict) -> PhaseReport:
    return PhaseReport("align.yaml", "c1", "forward", verdict, "b", "c", "t", "again")


def test_a_failing_lower_bound_says_less_than() -> None:
    table = ToleranceTable("t", (ToleranceRule(bounds=(("cosine", 0.99),), why="cos"),))
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y = torch.tensor([4.0, -3.0, 2.0, -1.0])  # cosine 0: far below 0.99
    verdict = _verdict(table, {"input": x, "activation": x}, {"input": x, "activation": y})
    assert verdict.first is not None and verdict.first.metric == "cosine"
    line = summary_line(_report(verdict))
    assert "cosine 0 < 0.99" in line, line
    assert "cosine 0 > 0.99" not in line


def test_error_index_is_multi_dimensional() -> None:
    table = ToleranceTable("t", (ToleranceRule(atol=1e-6, rtol=0.0, why="tight"),))
    x = torch.zeros(2, 3, 4)
    y = x.clone()
    y[1, 2, 3] = 1.0  # flat index 23
    y[0, 1, 2] = 0.5  # flat index 6
    verdict = _verdict(table, {"input": x, "activation": x}, {"input": x, "activation": y})
    first = verdict.first
    assert first is not None and first.pair.closeness is not None
    assert first.pair.closeness.worst_index == (1, 2, 3)
    assert first.pair.closeness.greatest_abs_index == (1, 2, 3)
    message = failure_message(_report(verdict))
    assert "at index (1, 2, 3)" in message, message
    assert "(23,)" not in message


def test_worst_record_shown_is_a_gated_output_not_an_input() -> None:
    """The input differs (un-gated evidence), the output matches: the worst shown is the output."""
    table = ToleranceTable("t", (ToleranceRule(atol=1e-3, rtol=0.0, why="t"),))
    x = torch.ones(4)
    verdict = _verdict(table, {"input": x, "activation": x}, {"input": x + 1.0, "activation": x + 5e-4})
    assert verdict.aligned
    assert verdict.worst is not None
    assert verdict.worst.record.kind == "activation"
    assert worst_metric(verdict) == "allclose=5.000e-04"


def _stepped(seq: int, name: str, step: int) -> Record:
    return Record(
        seq=seq,
        name=name,
        module_class="M",
        phase="forward",
        step=step,
        call=0,
        kind="activation",
        slot="out",
        dtype="float32",
        shape=(2,),
        tensor_key=f"t{seq}",
    )


def test_unmatched_counts_agree_across_steps() -> None:
    """7 candidate-only modules in each of 2 steps: 14 records, 7 per step, 7 names."""
    x = torch.ones(2)
    extra = [f"extra{i}" for i in range(7)]
    base = (_stepped(0, "m", 0), _stepped(1, "m", 1))
    cand = base + tuple(_stepped(2 + 2 * i + s, n, s) for i, n in enumerate(extra) for s in (0, 1))
    table = ToleranceTable("t", (ToleranceRule(atol=1e-6, rtol=0.0, why="t"),))

    def trace(recs: tuple[Record, ...]) -> Trace:
        return Trace({"record_mode": "tensor"}, recs, {r.tensor_key: x for r in recs})

    verdict = phase_verdict(compare_traces(trace(base), trace(cand), table), "forward", None, False)
    assert len(verdict.only_candidate) == 14
    message = failure_message(_report(verdict))
    line = next(li for li in message.splitlines() if li.startswith("Unmatched records:"))
    assert line == (
        "Unmatched records: 14 candidate-only records (7 per step over 2 steps; "
        "extra0, extra1, extra2, extra3, extra4, ... (7 names in all), "
        "14 unexplained: no mapping rule or reason says why)"
    )
    one_step = phase_verdict(
        compare_traces(trace(base[:1]), trace(cand[:1] + cand[2::2]), table), "forward", None, False
    )
    line = next(li for li in failure_message(_report(one_step)).splitlines() if li.startswith("Unmatched"))
    assert line.startswith("Unmatched records: 7 candidate-only (extra0, ")
    assert line.endswith("... (7 names in all), 7 unexplained: no mapping rule or reason says why)")
