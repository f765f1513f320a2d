"""Fuzzy matching of API records (seed 001 §3.1.1): inside a matched module, pair API calls
by their order, not by msprobe's global call counters (which shift as soon as one side makes
one call more or fewer elsewhere).

An API record ``Functional.linear`` call 13 whose parent module is ``model.layers.0.mlp``
(call 0) becomes ``model.layers.0.mlp.Functional.linear`` with call = its position among
that parent's ``Functional.linear`` calls (parent call c adds c * 1000, so a module called
twice keeps its calls apart).
"""

from __future__ import annotations

from dataclasses import replace

from ..trace.records import Record, Trace

_PER_PARENT_CALL = 1000


def fuzzy_api_calls(trace: Trace) -> Trace:
    parents = trace.manifest.get("parents") or {}
    order: dict[tuple[str, str], list[int]] = {}
    renamed: dict[tuple[str, int], tuple[str, int]] = {}
    for rec in trace.records:
        if rec.module_class != "api" or (rec.name, rec.call) in renamed:
            continue
        key = f"{rec.name}#{rec.call}"
        if key not in parents:
            continue
        parent = parents[key]  # "" at the top level
        parent_name, _, parent_call = parent.partition("#")
        seen = order.setdefault((parent, rec.name), [])
        seen.append(rec.call)
        call = int(parent_call or 0) * _PER_PARENT_CALL + len(seen) - 1
        renamed[(rec.name, rec.call)] = (f"{parent_name}.{rec.name}" if parent_name else rec.name, call)
    if not renamed:
        return trace

    def new(rec: Record) -> Record:
        name, call = renamed.get((rec.name, rec.call), (rec.name, rec.call))
        return replace(rec, name=name, call=call, deps=tuple(_rename_id(d, renamed) for d in rec.deps))

    return Trace(trace.manifest, tuple(new(r) for r in trace.records), trace.tensors, trace.run)


def _rename_id(record_id: str, renamed: dict[tuple[str, int], tuple[str, int]]) -> str:
    name, kind, slot, step, call = record_id.split("|")
    target = renamed.get((name, int(call)))
    if target is None:
        return record_id
    return "|".join((target[0], kind, slot, step, str(target[1])))
