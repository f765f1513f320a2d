"""Pairing of op records (record level ``op``/``mix``) between the two sides.

Op calls pair by (module path, module call, api, n): the n-th ``Functional.softmax`` call inside
``model.layers.0.self_attn``'s first call on one side is compared with the n-th on the other
(the record id holds all of it, see ``ops.py``). That is only sound when both sides make the
same number of calls of that api in that module call: where they don't (eager attention vs
sdpa, an extra dtype cast), index n means different calls, so every record of the group is
reported as unmatched with the reason instead of being compared. Op pairs whose shapes differ
are unmatched too (another call at the same index), and one-sided op records get a reason.
Module records are never touched: a real divergence still shows there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..trace.op_names import API_CLASS, PER_MODULE_CALL, split_op_name
from ..trace.records import Record, Trace
from .pairs import Comparison, PairResult

_Group = tuple[str, int, str, int]  # module path, module call, api, step


def op_level(trace: Trace) -> bool:
    return trace.manifest.get("record_level") in ("op", "mix")


def _group(rec: Record) -> _Group:
    module, api = split_op_name(rec.name)
    return module, rec.call // PER_MODULE_CALL, api, rec.step


def _counts(trace: Trace) -> dict[_Group, int]:
    calls: dict[_Group, set[int]] = {}
    for rec in trace.records:
        if rec.module_class == API_CLASS and rec.kind == "activation":
            calls.setdefault(_group(rec), set()).add(rec.call)
    return {g: len(c) for g, c in calls.items()}


def _where(group: _Group) -> str:
    module, module_call, _, step = group
    where = module or "the model's own forward"
    if module_call:
        where += f" (call {module_call})"
    return where + (f", step {step}" if step else "")


def _reason(group: _Group, base: Mapping[_Group, int], cand: Mapping[_Group, int]) -> str:
    a, b = base.get(group, 0), cand.get(group, 0)
    api, where = group[2], _where(group)
    if a == 0:
        return f"op call only in the candidate: the baseline makes no {api} call in {where}"
    if b == 0:
        return f"op call only in the baseline: the candidate makes no {api} call in {where}"
    return (
        f"{api} is called {a} times in {where} by the baseline and {b} times by the candidate: "
        "its calls are not paired by index"
    )


def settle_op_pairs(comparison: Comparison, baseline: Trace, candidate: Trace) -> Comparison:
    """Turn op pairs that cannot be trusted into unmatched records, with reasons."""
    if not (op_level(baseline) or op_level(candidate)):
        return comparison
    base, cand = _counts(baseline), _counts(candidate)
    out: list[PairResult] = []
    for pair in comparison.pairs:
        rec = pair.record
        if rec.module_class != API_CLASS:
            out.append(pair)
            continue
        group = _group(rec)
        if pair.paired and pair.candidate is not None:
            if base.get(group, 0) != cand.get(group, 0):
                reason = _reason(group, base, cand)
            elif pair.status == "shape":
                reason = f"{pair.note}: another call of {group[2]} at the same index in {_where(group)}"
            else:
                out.append(pair)
                continue
            out.append(PairResult(rec, None, "only_baseline", "none", note=reason))
            out.append(PairResult(pair.candidate, pair.candidate, "only_candidate", "none", note=reason))
        elif pair.paired or pair.note:
            out.append(pair)
        else:
            out.append(replace(pair, note=_reason(group, base, cand)))
    return Comparison(tuple(out))
