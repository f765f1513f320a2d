"""Bring a candidate trace to the baseline's names, slots and layouts (the mapping stage).

Tensor rules turn groups of candidate records into baseline records (a fused ``linear_qkv``
output becomes ``q_proj``/``k_proj``/``v_proj`` outputs); layout rules transpose records
one to one (``[s, b, h]`` -> ``[b, s, h]``); slot rules and the ``out.0``/``out``
reconciliation line up tuple outputs and keyword inputs; renames do the rest.

Reshaping tensors needs ``record: {mode: tensor}``. Statistics survive a permutation or a
broadcast unchanged and hashes survive only a plain rename; where the evidence cannot be
carried over, the record is left unmatched with that reason.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..trace.records import Record, TensorOverlay, Trace, record_id
from .spec import LayoutRule, MappingSpec, SlotRule, fill_pattern, match_pattern, to_baseline_name
from .transforms import TransformOp, apply_forward, apply_inverse

PERMUTING_OPS = {"transpose", "permute"}  # statistics are invariant under these


@dataclass(frozen=True)
class MappedTrace:
    trace: Trace
    reasons: Mapping[str, str]  # record id -> why it has no counterpart (either side)


def _to_baseline(
    ops: tuple[TransformOp, ...], rev: bool, tensors: list[Any], base_shapes: list[tuple[int, ...]]
) -> list[Any]:
    return apply_forward(ops, tensors) if rev else apply_inverse(ops, tensors, base_shapes)


def name_matches(pattern: str, name: str) -> bool:
    """``{x}`` matches one dotted segment (exactly), ``*`` anything (a glob)."""
    if "{" in pattern:
        return match_pattern(pattern, name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def _shape(
    ops: tuple[TransformOp, ...], rev: bool, shape: tuple[int, ...], base_shapes: list[tuple[int, ...]]
) -> tuple[int, ...]:
    """Where a record keeps only statistics: the shape its tensor would have in the baseline's
    layout (the ops run on a meta tensor)."""
    import torch

    if not base_shapes and not rev:
        return shape  # no baseline counterpart: the record stays unmatched anyway
    meta = torch.empty(shape, device="meta")
    return tuple(_to_baseline(ops, rev, [meta], base_shapes)[0].shape)


def _rule_matches_name(match: str, side: str, original: str, renamed: str) -> bool:
    return name_matches(match, original if side == "candidate" else renamed)


def map_trace(candidate: Trace, baseline: Trace, mapping: MappingSpec | None) -> MappedTrace:
    if mapping is None:
        return MappedTrace(candidate, {})
    base_ids = baseline.by_id()
    # Over the candidate's store, not a copy of it: a lazy store stays lazy.
    tensors = TensorOverlay(candidate.tensors if candidate.mode == "tensor" else {})
    out: list[Record] = []
    new_ids: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    consumed: set[str] = set()
    original_name: dict[str, str] = {}
    layout_cache: dict[tuple[str, int], tuple[str, Any, tuple[int, ...]]] = {}
    counter = 0

    def new_key() -> str:
        nonlocal counter
        counter += 1
        return f"m{counter:07d}"

    def emit(
        src: Record,
        name: str,
        slot: str,
        tensor: Any | None = None,
        stats: Any = None,
        crc: str | None = None,
        *,
        key: str | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> None:
        if tensor is not None and key is None:
            key = new_key()
            tensors[key] = tensor
        if shape is None:
            shape = tuple(tensor.shape) if tensor is not None else src.shape
        rec = replace(src, name=name, slot=slot, shape=shape, stats=stats, crc32=crc, tensor_key=key)
        out.append(rec)
        new_ids.setdefault(src.id, []).append(rec.id)
        original_name[rec.id] = src.name

    # 1. Tensor rules: groups of candidate records -> baseline records.
    by_id = candidate.by_id()
    for rule in mapping.tensors:
        record_kinds = set(rule.kinds) | ({"param_grad"} if "param" in rule.kinds else set())
        for rec in candidate.records:
            if rec.kind not in record_kinds or rec.id in consumed:
                continue
            bindings = match_pattern(rule.candidate[0], rec.name)
            if bindings is None:
                continue
            slots = dict(rule.slots)
            if rec.kind in ("param", "param_grad"):
                base_slot = rec.slot
            else:
                base_slot = slots.get(rec.slot, rec.slot)
                if rule.slots and rec.slot not in slots:
                    continue
            group = [
                by_id.get(record_id(fill_pattern(p, bindings), rec.kind, rec.slot, rec.step, rec.call))
                for p in rule.candidate
            ]
            if any(g is None for g in group):
                continue
            members = [g for g in group if g is not None]
            base_names = [fill_pattern(p, bindings) for p in rule.baseline]
            base_recs = [
                base_ids.get(record_id(n, rec.kind, base_slot, rec.step, rec.call)) for n in base_names
            ]
            consumed.update(m.id for m in members)
            if any(b is None for b in base_recs):
                for m in members:
                    reasons[m.id] = (
                        f"mapped by a tensor rule ({rule.where}) to {', '.join(base_names)}, which the baseline did not record"
                    )
                continue
            shapes = [b.shape for b in base_recs if b is not None]
            if all(m.tensor_key is not None for m in members):
                cand_tensors = [tensors[m.tensor_key] for m in members if m.tensor_key is not None]
                if rule.broadcast:
                    one = _to_baseline(rule.ops, rule.reversed, cand_tensors, shapes[:1])[0].contiguous()
                    one_stats, one_key = _tensor_stats(one), new_key()
                    tensors[one_key] = one  # one tensor stands for each baseline record
                    for name in base_names:
                        emit(members[0], name, base_slot, one, one_stats, key=one_key)
                else:
                    results = _to_baseline(rule.ops, rule.reversed, cand_tensors, shapes)
                    for name, tensor in zip(base_names, results, strict=True):
                        tensor = tensor.contiguous()
                        emit(members[0], name, base_slot, tensor, _tensor_stats(tensor))
            elif (
                rule.broadcast
                and members[0].stats is not None
                and all(op.op in PERMUTING_OPS for op in rule.ops)
            ):
                shape = _shape(rule.ops, rule.reversed, members[0].shape, shapes[:1])
                for name in base_names:
                    emit(members[0], name, base_slot, None, members[0].stats, shape=shape)
            else:
                why = f"{members[0].name} maps here through a layout transform ({rule.where}), which needs record: {{mode: tensor}}"
                for b in base_recs:
                    if b is not None:
                        reasons[b.id] = why
        # baseline side of a rule that found no candidate group stays unmatched normally

    # 2. Everything else: rename, slots, layouts.
    classes = {r.name: r.module_class for r in candidate.records if r.kind in ("activation", "input")}
    for rec in candidate.records:
        if rec.id in consumed:
            continue
        name = to_baseline_name(mapping, rec.name, classes.get)
        slot = _slot(mapping.slots, rec, name, base_ids)
        layout = _layout(mapping.layouts, rec, name)
        if layout is None:
            same_key = rec.tensor_key if candidate.mode == "tensor" else None
            emit(rec, name, slot, None, rec.stats, rec.crc32, key=same_key)  # same tensor, same key
            continue
        base = base_ids.get(record_id(name, rec.kind, slot, rec.step, rec.call))
        if rec.tensor_key is not None and base is not None:
            # Records sharing a tensor share its transformed copy (and compare results).
            cached = layout_cache.get((rec.tensor_key, id(layout)))
            if cached is None:
                (tensor,) = _to_baseline(layout.ops, layout.reversed, [tensors[rec.tensor_key]], [base.shape])
                tensor = tensor.contiguous()
                cached = (new_key(), _tensor_stats(tensor), tuple(tensor.shape))
                tensors[cached[0]] = tensor
                layout_cache[(rec.tensor_key, id(layout))] = cached
            emit(rec, name, slot, None, cached[1], key=cached[0], shape=cached[2])
        elif rec.stats is not None and all(op.op in PERMUTING_OPS for op in layout.ops):
            shape = _shape(layout.ops, layout.reversed, rec.shape, [base.shape] if base else [])
            emit(rec, name, slot, None, rec.stats, shape=shape)
        else:
            emit(rec, name, slot, None, None, None)
            if base is not None and rec.crc32 is not None:
                reasons[record_id(name, rec.kind, slot, rec.step, rec.call)] = (
                    "layout differs: hashes are not comparable"
                )

    # 3. Dependencies follow their records; ordering stays the candidate's execution order.
    final = []
    for rec in sorted(out, key=lambda r: r.seq):
        deps = tuple(d for old in rec.deps for d in new_ids.get(old, ()))
        final.append(replace(rec, deps=deps))
    for known in mapping.unmatched:
        if known.side == "candidate":
            for rec in final:
                if name_matches(known.match, original_name.get(rec.id, rec.name)):
                    reasons.setdefault(rec.id, known.reason)
        else:
            for rec in baseline.records:
                if name_matches(known.match, rec.name):
                    reasons.setdefault(rec.id, known.reason)
    for old, why in list(reasons.items()):
        for new in new_ids.get(old, ()):
            reasons.setdefault(new, why)
    manifest = {**dict(candidate.manifest), "mapping": mapping.name}
    mapped = Trace(manifest=manifest, records=tuple(final), tensors=tensors)
    return MappedTrace(mapped, reasons)


def _tensor_stats(tensor: Any) -> Any:
    from ..recording.recorder import tensor_stats  # imports torch: only layout transforms need it

    return tensor_stats(tensor)


def _slot(rules: tuple[SlotRule, ...], rec: Record, name: str, base_ids: Mapping[str, Record]) -> str:
    if rec.kind in ("param", "param_grad", "logits", "loss"):
        return rec.slot
    for rule in rules:
        if rec.slot == rule.candidate and _rule_matches_name(rule.match, rule.side, rec.name, name):
            return rule.baseline
    # A single-tensor output is `out` on one side and `out.0` (a tuple) on the other.
    if record_id(name, rec.kind, rec.slot, rec.step, rec.call) not in base_ids:
        for a, b in (("out.0", "out"), ("out", "out.0")):
            if rec.slot == a and record_id(name, rec.kind, b, rec.step, rec.call) in base_ids:
                return b
    return rec.slot


def _layout(rules: tuple[LayoutRule, ...], rec: Record, name: str) -> LayoutRule | None:
    for rule in rules:
        if rec.kind in rule.kinds and _rule_matches_name(rule.match, rule.side, rec.name, name):
            return rule
    return None
