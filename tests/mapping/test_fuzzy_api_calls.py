"""Fuzzy API matching on a real msprobe mix dump pair whose call counters are shifted."""

from __future__ import annotations

from dataclasses import replace

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable
from pytest_precalign.mapping.fuzzy_api_calls import fuzzy_api_calls
from pytest_precalign.msprobe import read_msprobe_dump
from pytest_precalign.trace.records import Trace
from pytest_precalign.verdict.phase import phase_verdict
from tests.helpers.paths import MSPROBE_DATA

MICRO = MSPROBE_DATA / "micro"
TABLE = ToleranceTable("t", (ToleranceRule(atol=1e-6, rtol=1e-5, why="t"),))


def _shift_api_calls(trace: Trace, by: int) -> Trace:
    """As if the candidate made `by` more calls of every API before this step's first one."""

    def shift(name: str, call: int) -> int:
        return call + by if "." in name and name.split(".")[0] in ("Functional", "Tensor", "Torch") else call

    records = tuple(
        replace(
            r,
            call=shift(r.name, r.call),
            deps=tuple(
                "|".join((*d.split("|")[:4], str(shift(d.split("|")[0], int(d.split("|")[4])))))
                for d in r.deps
            ),
        )
        for r in trace.records
    )
    parents = {}
    for key, value in trace.manifest["parents"].items():
        name, _, call = key.partition("#")
        parents[f"{name}#{shift(name, int(call))}"] = value
    return Trace({**trace.manifest, "parents": parents}, records, trace.tensors)


def test_fuzzy_match_pairs_api_calls_by_order_inside_modules():
    base = read_msprobe_dump(MICRO / "base_micro_statistics_mix_statistics")
    cand = _shift_api_calls(read_msprobe_dump(MICRO / "pert_micro_statistics_mix_statistics"), by=7)
    plain = compare_traces(base, cand, TABLE)
    api_unpaired = [p for p in plain.pairs if p.status == "only_baseline" and p.record.module_class == "api"]
    assert len(api_unpaired) > 10  # counters shifted: API records no longer pair
    fuzzy = compare_traces(fuzzy_api_calls(base), fuzzy_api_calls(cand), TABLE)
    assert not [p for p in fuzzy.pairs if p.status.startswith("only_") and p.record.module_class == "api"]
    verdict = phase_verdict(fuzzy, "forward", None, False, parents=None)
    first = verdict.first
    assert first is not None
    assert first.name in ("model.layers.0.mlp.down_proj", "model.layers.0.mlp.down_proj.Functional.linear")


def test_fuzzy_is_identity_without_api_records():
    trace = read_msprobe_dump(MICRO / "base_micro_statistics_L0_statistics")
    assert fuzzy_api_calls(trace) is trace
