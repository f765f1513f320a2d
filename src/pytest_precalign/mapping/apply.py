"""Bring a candidate trace to the baseline's names, slots and layouts (the mapping stage).

Tensor rules turn groups of candidate records into baseline records (a fused ``linear_qkv``
output becomes ``q_proj``/``k_proj``/``v_proj`` outputs); layout rules transpose records
one to one (``[s, b, h]`` -> ``[b, s, h]``); slot rules and the ``out.0``/``out``
reconciliation line up tuple outputs and keyword inputs; renames do the rest.

Reshaping tensors needs ``record: {mode: tensor}``. Statistics survive a permutation or a
broadcast unchanged, and a tensor rule's group (every op only rearranges elements) by merging:
the parts' statistics merged meet the fused record's (``merge_group``, ``trace/merged_stats``).
Hashes survive only a plain rename; where the evidence cannot be carried over, the record is
left unmatched with that reason.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..trace.merged_stats import merge_stats, merged_record
from ..trace.records import Record, TensorOverlay, Trace, record_id
from .layer_mapping import RuleKey
from .spec import LayoutRule, MappingSpec, SlotRule, TensorRule, fill_pattern, match_pattern, to_baseline_name
from .transforms import TransformOp, apply_forward, apply_inverse, transform_error

PERMUTING_OPS = {"transpose", "permute"}  # statistics are invariant under these


@dataclass(frozen=True)
class MappedTrace:
    trace: Trace
    reasons: Mapping[str, str]  # record id -> why it has no counterpart (either side)
    applied: frozenset[RuleKey] = field(default_factory=frozenset)  # rules that matched a record
    candidate_names: Mapping[str, str] = field(default_factory=dict)  # mapped name -> candidate's own
    # Baseline records standing for several of the baseline's own, whose statistics were merged
    # to meet a candidate record that fuses them: ``with_merged`` puts them in the baseline.
    baseline_merged: tuple[Record, ...] = ()


def _to_baseline(
    ops: tuple[TransformOp, ...],
    rev: bool,
    tensors: list[Any],
    base_shapes: list[tuple[int, ...]],
    what: tuple[str, str, Record],
) -> list[Any]:
    """The ops undone (or run, for a reversed rule) on candidate tensors; ``what`` (the
    rule's file:line, the rule, the record) names a transform that does not fit the shapes."""
    try:
        return apply_forward(ops, tensors) if rev else apply_inverse(ops, tensors, base_shapes)
    except (RuntimeError, ValueError, IndexError) as exc:
        where, rule, rec = what
        record = f"{rec.name} ({rec.kind}, {rec.slot or 'value'}, step {rec.step})"
        shapes = [tuple(t.shape) for t in tensors]
        raise transform_error(where, rule, record, shapes, base_shapes, exc) from None


def name_matches(pattern: str, name: str) -> bool:
    """``{x}`` matches one dotted segment (exactly), ``*`` anything (a glob)."""
    if "{" in pattern:
        return match_pattern(pattern, name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def _shape(
    ops: tuple[TransformOp, ...],
    rev: bool,
    shape: tuple[int, ...],
    base_shapes: list[tuple[int, ...]],
    what: tuple[str, str, Record],
) -> tuple[int, ...]:
    """Where a record keeps only statistics: the shape its tensor would have in the baseline's
    layout (the ops run on a meta tensor)."""
    import torch

    if not base_shapes and not rev:
        return shape  # no baseline counterpart: the record stays unmatched anyway
    meta = torch.empty(shape, device="meta")
    return tuple(_to_baseline(ops, rev, [meta], base_shapes, what)[0].shape)


def _rule_matches_name(match: str, side: str, original: str, renamed: str) -> bool:
    return name_matches(match, original if side == "candidate" else renamed)


def map_trace(candidate: Trace, baseline: Trace, mapping: MappingSpec | None) -> MappedTrace:
    if mapping is None:
        return MappedTrace(candidate, {})
    mapper = _Mapper(candidate, baseline, mapping)
    # 1. Tensor rules: groups of candidate records -> baseline records.
    for index, rule in enumerate(mapping.tensors):
        if mapper.apply_tensor_rule(rule):
            mapper.applied.add(("tensors", str(index)))
    # 2. Everything else: rename, slots, layouts.
    mapper.map_the_rest()
    # 3. Dependencies follow their records; ordering stays the candidate's execution order.
    return mapper.result()


class _Mapper:
    """The state of one ``map_trace``: the mapped records so far, their tensors (over the
    candidate's store, not a copy of it: a lazy store stays lazy), and why records have no
    counterpart."""

    def __init__(self, candidate: Trace, baseline: Trace, mapping: MappingSpec) -> None:
        self.candidate, self.baseline, self.mapping = candidate, baseline, mapping
        self.base_ids = baseline.by_id()
        self.by_id = candidate.by_id()
        self.tensors = TensorOverlay(candidate.tensors if candidate.mode == "tensor" else {})
        self.out: list[Record] = []
        self.new_ids: dict[str, list[str]] = {}
        self.reasons: dict[str, str] = {}
        self.consumed: set[str] = set()
        self.original_name: dict[str, str] = {}
        self.layout_cache: dict[tuple[str, int], tuple[str, Any, tuple[int, ...]]] = {}
        self.counter = 0
        self.applied: set[RuleKey] = set()
        self.base_merged: list[Record] = []  # the baseline's parts merged (``merge_group``)

    def new_key(self) -> str:
        self.counter += 1
        return f"m{self.counter:07d}"

    def emit(
        self,
        src: Record,
        name: str,
        slot: str,
        tensor: Any | None = None,
        stats: Any = None,
        crc: str | None = None,
        *,
        key: str | None = None,
        shape: tuple[int, ...] | None = None,
        merged: tuple[str, ...] = (),
    ) -> None:
        if tensor is not None and key is None:
            key = self.new_key()
            self.tensors[key] = tensor
        if shape is None:
            shape = tuple(tensor.shape) if tensor is not None else src.shape
        rec = replace(
            src, name=name, slot=slot, shape=shape, stats=stats, crc32=crc, tensor_key=key, merged=merged
        )
        self.out.append(rec)
        self.new_ids.setdefault(src.id, []).append(rec.id)
        self.original_name[rec.id] = src.name

    def apply_tensor_rule(self, rule: TensorRule) -> bool:
        """Each group of candidate records the rule matches becomes the baseline's records; the
        baseline side of a rule that found no candidate group stays unmatched normally. Returns
        whether the rule matched a group."""
        by_id, matched = self.by_id, False
        record_kinds = set(rule.kinds) | ({"param_grad"} if "param" in rule.kinds else set())
        for rec in self.candidate.records:
            if rec.kind not in record_kinds or rec.id in self.consumed:
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
            self.map_group(rule, members, base_names, base_slot)
            matched = True
        return matched

    def map_group(
        self, rule: TensorRule, members: list[Record], base_names: list[str], base_slot: str
    ) -> None:
        first = members[0]
        base_recs = [
            self.base_ids.get(record_id(n, first.kind, base_slot, first.step, first.call)) for n in base_names
        ]
        self.consumed.update(m.id for m in members)
        if any(b is None for b in base_recs):
            for m in members:
                self.reasons[m.id] = (
                    f"mapped by a tensor rule ({rule.where}) to {', '.join(base_names)}, which the baseline did not record"
                )
            return
        shapes = [b.shape for b in base_recs if b is not None]
        what = (rule.where, _describe_tensor_rule(rule), first)
        if all(m.tensor_key is not None for m in members):
            cand_tensors = [self.tensors[m.tensor_key] for m in members if m.tensor_key is not None]
            if rule.broadcast:
                one = _to_baseline(rule.ops, rule.reversed, cand_tensors, shapes[:1], what)[0].contiguous()
                one_stats, one_key = _tensor_stats(one), self.new_key()
                self.tensors[one_key] = one  # one tensor stands for each baseline record
                for name in base_names:
                    self.emit(first, name, base_slot, one, one_stats, key=one_key)
            else:
                results = _to_baseline(rule.ops, rule.reversed, cand_tensors, shapes, what)
                for name, tensor in zip(base_names, results, strict=True):
                    tensor = tensor.contiguous()
                    self.emit(first, name, base_slot, tensor, _tensor_stats(tensor))
        elif rule.broadcast and first.stats is not None and all(op.op in PERMUTING_OPS for op in rule.ops):
            shape = _shape(rule.ops, rule.reversed, first.shape, shapes[:1], what)
            for name in base_names:
                self.emit(first, name, base_slot, None, first.stats, shape=shape)
        elif not rule.broadcast and all(
            r is not None and r.stats is not None for r in (*members, *base_recs)
        ):
            self.merge_group(rule, members, [b for b in base_recs if b is not None], base_slot, what)
        else:
            why = f"{first.name} maps here through a layout transform ({rule.where}), which needs record: {{mode: tensor}}"
            for b in base_recs:
                if b is not None:
                    self.reasons[b.id] = why

    def merge_group(
        self,
        rule: TensorRule,
        members: list[Record],
        base_recs: list[Record],
        base_slot: str,
        what: tuple[str, str, Record],
    ) -> None:
        """A group in statistics: every transform op only rearranges elements, so the
        statistics of each side's parts merge into those of the fused tensor (``merged_stats``).
        One record on each side carries them, under the baseline's name (braced when the
        baseline's parts are merged: ``self_attn.{q_proj,k_proj,v_proj}``) and with the
        element count as its shape; one record against one keeps its stats and shape."""
        first = members[0]
        metas = [_meta(m.shape) for m in members]
        fits = _to_baseline(rule.ops, rule.reversed, metas, [b.shape for b in base_recs], what)
        parts = [(m.stats, m.numel) for m in members if m.stats is not None]
        stats = merge_stats(parts) if len(members) > 1 else first.stats
        own = tuple(m.name for m in members) if len(members) > 1 else ()
        if len(base_recs) == 1:
            shape = tuple(fits[0].shape) if len(fits) == 1 else (sum(m.numel for m in members),)
            self.emit(first, base_recs[0].name, base_slot, None, stats, shape=shape, merged=own)
            return
        base = merged_record(base_recs)
        self.base_merged.append(base)
        self.emit(
            first, base.name, base_slot, None, stats, shape=(sum(m.numel for m in members),), merged=own
        )

    def map_the_rest(self) -> None:
        """Records no tensor rule consumed: renamed, slots lined up, layouts transformed."""
        mapping = self.mapping
        classes = {
            r.name: r.module_class for r in self.candidate.records if r.kind in ("activation", "input")
        }
        for rec in self.candidate.records:
            if rec.id in self.consumed:
                continue
            name = to_baseline_name(mapping, rec.name, classes.get, self.applied)
            slot = _slot(mapping.slots, rec, name, self.base_ids, self.applied)
            layout = _layout(mapping.layouts, rec, name, self.applied)
            if layout is None:
                same_key = rec.tensor_key if self.candidate.mode == "tensor" else None
                self.emit(rec, name, slot, None, rec.stats, rec.crc32, key=same_key)  # same tensor, same key
            else:
                self.map_layout(rec, name, slot, layout)

    def map_layout(self, rec: Record, name: str, slot: str, layout: LayoutRule) -> None:
        base = self.base_ids.get(record_id(name, rec.kind, slot, rec.step, rec.call))
        what = (layout.where, f"layouts rule {layout.match!r}", rec)
        if rec.tensor_key is not None and base is not None:
            # Records sharing a tensor share its transformed copy (and compare results).
            cached = self.layout_cache.get((rec.tensor_key, id(layout)))
            if cached is None:
                (tensor,) = _to_baseline(
                    layout.ops, layout.reversed, [self.tensors[rec.tensor_key]], [base.shape], what
                )
                tensor = tensor.contiguous()
                cached = (self.new_key(), _tensor_stats(tensor), tuple(tensor.shape))
                self.tensors[cached[0]] = tensor
                self.layout_cache[(rec.tensor_key, id(layout))] = cached
            self.emit(rec, name, slot, None, cached[1], key=cached[0], shape=cached[2])
        elif rec.stats is not None and all(op.op in PERMUTING_OPS for op in layout.ops):
            shape = _shape(layout.ops, layout.reversed, rec.shape, [base.shape] if base else [], what)
            self.emit(rec, name, slot, None, rec.stats, shape=shape)
        else:
            self.emit(rec, name, slot, None, None, None)
            if base is not None and rec.crc32 is not None:
                self.reasons[record_id(name, rec.kind, slot, rec.step, rec.call)] = (
                    "layout differs: hashes are not comparable"
                )

    def result(self) -> MappedTrace:
        """Dependencies follow their records; ordering stays the candidate's execution order;
        known-unmatched reasons apply to both sides and follow mapped records."""
        reasons, new_ids = self.reasons, self.new_ids
        final = []
        for rec in sorted(self.out, key=lambda r: r.seq):
            deps = tuple(d for old in rec.deps for d in new_ids.get(old, ()))
            final.append(replace(rec, deps=deps))
        for known in self.mapping.unmatched:
            if known.side == "candidate":
                for rec in final:
                    if name_matches(known.match, self.original_name.get(rec.id, rec.name)):
                        reasons.setdefault(rec.id, known.reason)
            else:
                for rec in self.baseline.records:
                    if name_matches(known.match, rec.name):
                        reasons.setdefault(rec.id, known.reason)
        for old, why in list(reasons.items()):
            for new in new_ids.get(old, ()):
                reasons.setdefault(new, why)
        manifest = {**dict(self.candidate.manifest), "mapping": self.mapping.name}
        mapped = Trace(manifest=manifest, records=tuple(final), tensors=self.tensors, run=self.candidate.run)
        names = {
            r.name: self.original_name[r.id] for r in final if self.original_name.get(r.id, r.name) != r.name
        }
        return MappedTrace(mapped, reasons, frozenset(self.applied), names, tuple(self.base_merged))


def _meta(shape: tuple[int, ...]) -> Any:
    import torch

    return torch.empty(shape, device="meta")


def _tensor_stats(tensor: Any) -> Any:
    from ..recording.tensor_summary import tensor_stats  # imports torch: only layout transforms need it

    return tensor_stats(tensor)


def _describe_tensor_rule(rule: TensorRule) -> str:
    names = rule.candidate[0] if len(rule.candidate) == 1 else list(rule.candidate)
    return f"tensors rule {names!r}"


def _slot(
    rules: tuple[SlotRule, ...], rec: Record, name: str, base_ids: Mapping[str, Record], applied: set[RuleKey]
) -> str:
    if rec.kind in ("param", "param_grad", "logits", "loss"):
        return rec.slot
    for index, rule in enumerate(rules):
        if rec.slot == rule.candidate and _rule_matches_name(rule.match, rule.side, rec.name, name):
            applied.add(("slots", str(index)))
            return rule.baseline
    # A single-tensor output is `out` on one side and `out.0` (a tuple) on the other.
    if record_id(name, rec.kind, rec.slot, rec.step, rec.call) not in base_ids:
        for a, b in (("out.0", "out"), ("out", "out.0")):
            if rec.slot == a and record_id(name, rec.kind, b, rec.step, rec.call) in base_ids:
                return b
    return rec.slot


def _layout(
    rules: tuple[LayoutRule, ...], rec: Record, name: str, applied: set[RuleKey]
) -> LayoutRule | None:
    for index, rule in enumerate(rules):
        if rec.kind in rule.kinds and _rule_matches_name(rule.match, rule.side, rec.name, name):
            applied.add(("layouts", str(index)))
            return rule
    return None
