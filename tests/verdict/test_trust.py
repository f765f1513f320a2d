"""Trust on first contact (issue #25): a verdict only on evidence that can decide it.

Records written as data, as in test_rules.py: evidence kinds that cannot be compared with each
other are *not compared* (and counted against coverage), a step on one side only fails, one
tolerance rule means one thing in stats and tensor mode, an origin needs paired evidence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable, default_table
from pytest_precalign.reports.coverage_text import coverage_problem_text
from pytest_precalign.reports.text import PhaseReport, failure_message, summary_line
from pytest_precalign.trace.records import Record, Stats, Trace
from pytest_precalign.verdict.coverage import NothingComparable
from pytest_precalign.verdict.phase import PhaseVerdict, phase_verdict
from pytest_precalign.verdict.run_findings import StepsOneSided
from pytest_precalign.verdict.story import tell_case

from .test_rules import rec, rid, verdict


def _report(v: PhaseVerdict, phase: str = "forward") -> PhaseReport:
    return PhaseReport("align.yaml", "case", phase, v, "base", "cand", "default", "precalign compare a b")


# -- 2: evidence kinds that cannot be compared ----------------------------------------------------


def _chain(n: int, scale: float = 1.0) -> list[Record]:
    out = []
    for i in range(n):
        out.append(rec(2 * i, f"l{i}", "input", scale))
        out.append(rec(2 * i + 1, f"l{i}", "activation", scale, deps=(rid(f"l{i}", "input"),)))
    return out


def _hashed(records: list[Record], prefix: str = "xor:") -> list[Record]:
    """The records as an xor-summary (or our hash mode) dump keeps them: a checksum, no statistics."""
    return [replace(r, stats=None, crc32=f"{prefix}{r.seq:016x}") for r in records]


def _skewed(records: list[Record]) -> list[Record]:
    """Every statistic x1000 + 7: nothing like the baseline."""

    def skew(s: Stats) -> Stats:
        return Stats(s.max * 1000 + 7, s.min * 1000 + 7, s.mean * 1000 + 7, s.norm * 1000 + 7, 0, 0)

    return [replace(r, stats=skew(r.stats)) if r.stats is not None else r for r in records]


def _judge(base: Trace, cand: Trace, phase: str = "forward") -> PhaseVerdict:
    comparison = compare_traces(base, cand, default_table())
    return phase_verdict(comparison, phase, None, False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("base_manifest", "cand_manifest", "words"),
    [
        (
            {"format": "msprobe", "summary_mode": "xor"},
            {"record_mode": "stats"},
            "xor checksum vs statistics",
        ),
        ({"record_mode": "hash"}, {"record_mode": "stats"}, "CRC-32 checksum vs statistics"),
        ({"record_mode": "stats"}, {"record_mode": "hash"}, "statistics vs CRC-32 checksum"),
    ],
)
def test_a_checksum_against_statistics_is_not_compared(
    base_manifest: dict[str, str], cand_manifest: dict[str, str], words: str
) -> None:
    base, cand = _chain(3), _skewed(_chain(3))
    prefix = "xor:" if base_manifest.get("summary_mode") == "xor" else ""
    if "stats" not in base_manifest.get("record_mode", ""):
        base = _hashed(base, prefix)
    else:
        cand = _hashed(cand, prefix)
    v = _judge(Trace(base_manifest, tuple(base)), Trace(cand_manifest, tuple(cand)))
    assert not v.passed
    assert v.records == ()  # nothing was judged: nothing to chart as compared
    assert v.compared == 0
    assert v.coverage is not None and not v.coverage.ok
    assert v.coverage.uncompared == 3
    assert f"cannot be compared ({words})" in coverage_problem_text(v.coverage)
    line = summary_line(_report(v))
    assert line.startswith("FAILED") and "aligned" not in line
    assert f"({words})" in failure_message(_report(v))


def test_incomparable_records_count_against_coverage() -> None:
    # 2 of 3 outputs compared as statistics, 1 only as a checksum on one side: 67% coverage, said why.
    base, cand = _chain(3), _chain(3)
    cand[5] = replace(cand[5], stats=None, crc32="deadbeef")
    v = _judge(Trace({"record_mode": "stats"}, tuple(base)), Trace({"record_mode": "stats"}, tuple(cand)))
    assert v.coverage is not None
    assert (v.coverage.paired, v.coverage.outputs, v.coverage.uncompared) == (2, 3, 1)
    assert v.passed  # above the 50% floor
    assert "1 not compared (statistics vs CRC-32 checksum)" in failure_message(_report(v))


def test_two_kinds_of_checksum_are_not_compared() -> None:
    base = _hashed(_chain(2), "xor:")
    cand = _hashed(_chain(2), "md5:")
    v = _judge(
        Trace({"format": "msprobe", "summary_mode": "xor"}, tuple(base)),
        Trace({"format": "msprobe", "summary_mode": "md5"}, tuple(cand)),
    )
    assert not v.passed and v.failures == ()
    assert v.coverage is not None and v.coverage.problem == NothingComparable()
    assert "(xor checksum vs md5 checksum)" in coverage_problem_text(v.coverage)


# -- 7: atol .inf means "not gated" in stats mode as in tensor mode -------------------------------


def test_atol_inf_does_not_gate_statistics_as_it_does_not_gate_tensors() -> None:
    table = ToleranceTable("t", (ToleranceRule(atol=float("inf"), rtol=0.0, why="any value"),))
    base, cand = _chain(2), _chain(2)
    cand[3] = replace(cand[3], stats=Stats(5.0, -5.0, 0.0, 10.0, 0, 0))
    manifest = {"record_mode": "stats"}
    comparison = compare_traces(Trace(manifest, tuple(base)), Trace(manifest, tuple(cand)), table)
    pair = next(p for p in comparison.pairs if p.record.id == rid("l1", "activation"))
    assert pair.passed, pair.checks
    # NaN/Inf on one side only still fails: atol bounds differences, not non-finite values.
    cand[3] = replace(cand[3], stats=Stats(float("nan"), -5.0, 0.0, 10.0, 1, 0))
    comparison = compare_traces(Trace(manifest, tuple(base)), Trace(manifest, tuple(cand)), table)
    pair = next(p for p in comparison.pairs if p.record.id == rid("l1", "activation"))
    assert not pair.passed


def test_a_rule_of_metric_bounds_only_still_holds_statistics_to_1e_3() -> None:
    table = ToleranceTable("t", (ToleranceRule(bounds=(("cosine", 0.99),)),))
    base, cand = _chain(1), _chain(1)
    cand[1] = replace(cand[1], stats=Stats(1.01, -1.0, 0.0, 2.0, 0, 0))
    manifest = {"record_mode": "stats"}
    comparison = compare_traces(Trace(manifest, tuple(base)), Trace(manifest, tuple(cand)), table)
    assert not next(p for p in comparison.pairs if p.record.kind == "activation").passed


# -- 3: a step on one side only -------------------------------------------------------------------


def _at_step(records: list[Record], step: int) -> list[Record]:
    def moved(d: str) -> str:
        name, kind, slot, _, call = d.split("|")
        return f"{name}|{kind}|{slot}|{step}|{call}"

    return [replace(r, step=step, seq=r.seq + 100 * step, deps=tuple(map(moved, r.deps))) for r in records]


def test_a_step_recorded_on_one_side_only_fails_naming_it() -> None:
    base = _at_step(_chain(2), 0) + _at_step(_chain(2), 1)
    cand = _at_step(_chain(2), 0)
    v = verdict(base, cand)
    assert v.coverage is not None and v.coverage.ratio == 0.5  # at the floor: it used to pass
    assert not v.passed
    assert v.coverage.problem == StepsOneSided("baseline", (1,))
    assert "step 1 was recorded by the baseline only" in coverage_problem_text(v.coverage)
    v = verdict(cand, base)
    assert not v.passed and v.coverage is not None
    assert "step 1 was recorded by the candidate only" in coverage_problem_text(v.coverage)


def test_the_failing_records_table_has_a_step_column_over_several_steps() -> None:
    base = _at_step(_chain(2), 0) + _at_step(_chain(2), 1)
    cand = _at_step(_chain(2), 0) + _at_step(_skewed(_chain(2)), 1)
    text = failure_message(_report(verdict(base, cand)))
    table = text.split("Failing records (execution order):\n")[1].splitlines()
    assert table[0].split() == ["record", "(baseline", "name)", "step", "kind", "metric", "value", "allowed"]
    assert table[1].split()[:3] == ["l0", "1", "activation"]
    one_step = failure_message(_report(verdict(_chain(2), _skewed(_chain(2)))))
    assert " step " not in one_step.split("Failing records (execution order):\n")[1].splitlines()[0]


# -- 1: an origin needs paired evidence -----------------------------------------------------------


def test_a_module_on_one_side_only_is_never_the_case_origin() -> None:
    """A fused-QKV port whose mapping swaps q and k: the first divergence is attn.q_proj; the
    rotary embedding the baseline recorded has no partner, so it proves nothing."""

    def side(candidate: bool) -> list[Record]:
        q = 2.0 if candidate else 1.0
        out = [
            rec(1, "rotary", "input", 1.0),
            rec(2, "rotary", "activation", 1.0, deps=(rid("rotary", "input"),)),
            rec(3, "attn.q_proj", "input", 1.0),
            rec(
                4,
                "attn.q_proj",
                "activation",
                q,
                deps=(rid("attn.q_proj", "input"), rid("rotary", "activation")),
            ),
            rec(5, "attn", "activation", q, deps=(rid("attn", "input"),)),
        ]
        return [r for r in out if not (candidate and r.name == "rotary")]

    forward = verdict(side(False), side(True))
    told = tell_case({"forward": forward}, ("forward",))["forward"]
    origin = told.case_origin
    assert origin is not None and told.first is not None
    assert told.first.name == "attn.q_proj"
    assert "rotary" not in origin.module and "only" not in origin.module
    assert origin.module == "attn.q_proj" and origin.proven is False
    head = failure_message(_report(told)).splitlines()[0]
    assert (
        head.startswith("Origin unproven (forward, step 0)")
        and "first divergent paired module: attn.q_proj" in head
    )


def test_an_unpaired_call_before_the_divergence_is_not_named_as_its_origin() -> None:
    """No module tree (an L1 dump): a call one side made just before the first divergence was
    named as where it entered ("rotary.0.forward (baseline only)"). It has no partner: the
    origin is the first divergent paired record, unproven."""
    base = [
        rec(0, "Functional.rotary", "activation", 1.0, module_class="api"),
        rec(1, "Functional.linear", "input", 1.0, module_class="api"),
        rec(
            2,
            "Functional.linear",
            "activation",
            1.0,
            module_class="api",
            deps=(rid("Functional.linear", "input"),),
        ),
        rec(3, "Functional.gelu", "activation", 1.0, module_class="api"),
    ]
    cand = [
        replace(base[1], stats=Stats(1.5, -1.5, 0.0, 3.0, 0, 0)),
        replace(base[2], stats=Stats(2.0, -2.0, 0.0, 4.0, 0, 0)),
        base[3],
    ]
    parents = {f"Functional.{n}#0": "" for n in ("rotary", "linear", "gelu")}  # each call's parent: none
    v = verdict(base, cand, parents=parents, level="op")
    told = tell_case({"forward": v}, ("forward",))["forward"]
    assert told.first is not None and told.case_origin is not None
    assert "only" not in told.first.origin_module
    assert told.case_origin.module == "Functional.linear"
    assert told.case_origin.proven is False
    head = failure_message(_report(told)).splitlines()[0]
    assert head.startswith("Origin unproven (forward, step 0)")
    assert head.endswith("first divergent paired module: Functional.linear")
    # The one-sided call stays a hint, never the origin.
    assert "only one side made just before it: Functional.rotary.0.forward (baseline only)" in head


def test_a_downstream_phase_names_the_first_divergent_paired_module() -> None:
    """The backward after an unproven forward origin says downstream of the paired module."""

    def side(candidate: bool) -> list[Record]:
        q = 2.0 if candidate else 1.0
        out = [
            rec(0, "rotary", "activation", 1.0),
            rec(1, "q_proj", "input", 1.0),
            rec(2, "q_proj", "activation", q, deps=(rid("q_proj", "input"), rid("rotary", "activation"))),
            rec(3, "q_proj", "grad_output", 1.0),
            rec(4, "q_proj", "grad_input", q, deps=(rid("q_proj", "grad_output"),)),
        ]
        return [r for r in out if not (candidate and r.name == "rotary")]

    verdicts = {p: verdict(side(False), side(True), phase=p) for p in ("forward", "backward")}
    told = tell_case(verdicts, ("forward", "backward"))
    backward = told["backward"]
    text = failure_message(_report(backward, "backward"))
    assert "Downstream of q_proj (forward, step 0)" in text
    assert "rotary" not in text.split("\n")[0]
