"""Verdict rules learned from the msprobe fault corpus, on small statistics-only traces:
a lower-precision layer is named when a later layer fails, and statistics call a layer the
origin only when it changed clearly more than its inputs."""

from __future__ import annotations

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.trace.records import Record, Stats, Trace
from pytest_precalign.verdict.phase import Divergence, phase_verdict


def _rec(
    seq: int, name: str, kind: str, scale: float, dtype: str = "float32", deps: tuple[str, ...] = ()
) -> Record:
    stats = Stats(max=scale, min=-scale, mean=0.0, norm=2 * scale)
    slot = "in.0" if kind == "input" else "out"
    return Record(seq, name, "M", "forward", 0, 0, kind, slot, dtype, (4,), stats=stats, deps=deps)


def _first(base: list[Record], cand: list[Record]) -> Divergence | None:
    manifest = {"record_mode": "stats"}
    comparison = compare_traces(Trace(manifest, tuple(base)), Trace(manifest, tuple(cand)), default_table())
    return phase_verdict(comparison, "forward", None, False).first


def _chain(a_out: float, a_dtype: str, b_out: float, b_dtype: str = "float32") -> list[Record]:
    a_in = "a|input|in.0|0|0"
    b_in = "b|input|in.0|0|0"
    return [
        _rec(0, "a", "input", 1.0),
        _rec(1, "a", "activation", a_out, a_dtype, deps=(a_in,)),
        _rec(2, "b", "input", a_out, a_dtype),
        _rec(3, "b", "activation", b_out, b_dtype, deps=(b_in,)),
    ]


def test_lower_precision_layer_is_named_when_a_later_layer_fails() -> None:
    base = _chain(1.0, "float32", 10.0)
    # a ran in bf16: 1e-3 off is within bf16's tolerance, b's 1e-2 is not within fp32's
    first = _first(base, _chain(1.001, "bfloat16", 10.01))
    assert first is not None and first.name == "a" and first.origin
    assert first.why.startswith("dtype bfloat16 (candidate) vs float32 (baseline): within the bfloat16")


def test_whole_run_in_lower_precision_names_the_failing_layer() -> None:
    base = _chain(1.0, "float32", 10.0)
    first = _first(base, _chain(1.001, "bfloat16", 10.5, "bfloat16"))  # b fails even for bf16
    assert first is not None and first.name == "b" and first.why == ""


def test_statistics_origin_needs_a_clear_relative_change() -> None:
    base = [_rec(0, "a", "input", 1e-3), _rec(1, "a", "activation", 1.0, deps=("a|input|in.0|0|0",))]
    # the input moved by 1e-4 relative (under atol 1e-5), the output by 4e-4: propagated
    propagated = [_rec(0, "a", "input", 1.0001e-3), _rec(1, "a", "activation", 1.0004)]
    first = _first(base, propagated)
    assert first is not None and first.name == "a" and not first.origin
    # the same output change on an identical input: the layer made it
    first = _first(base, [_rec(0, "a", "input", 1e-3), _rec(1, "a", "activation", 1.0004)])
    assert first is not None and first.origin
