"""Name and layout mapping between a baseline and a candidate model, as data.

A ``MappingSpec`` holds
* ``renames``: candidate name prefix <-> baseline name prefix, with ``{placeholders}`` that
  match one dotted segment (``decoder.layers.{i}.mlp`` <-> ``model.layers.{i}.mlp``);
* ``tensors``: many-to-many tensor rules with a chain of invertible ops (concat, split,
  permute, transpose, reshape, qkv_fuse, ...) taking baseline tensors to candidate tensors.

Weights are synced with the forward direction; candidate records are brought to the
baseline's names and layouts with the inverse. Ops import torch only when applied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..vocabulary import KINDS, MODULE_KINDS
from ..yaml_reader import Reader, describe, read_yaml_file
from .layer_mapping import LayerMapping, RuleKey
from .transforms import OP_ARITY, OP_PARAMS, TransformOp, check_qkv

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class NameRule:
    baseline: str
    candidate: str
    where: str = field(default="", compare=False)  # file:line of the rule
    optional: bool = False  # may apply to nothing (e.g. a preset shared across model sizes)


@dataclass(frozen=True)
class TensorRule:
    """``baseline`` tensors --ops--> ``candidate`` tensors, for the given record kinds.

    ``kinds`` containing ``param`` covers weights (sync) and ``param``/``param_grad``
    records. For module records, ``slots`` maps candidate slots to baseline slots, and
    ``broadcast`` says the one candidate tensor stands for each baseline tensor (e.g. the
    input of a fused qkv projection is the input of q, k and v). ``reversed``: the ops go
    candidate -> baseline (a mapping used the other way round)."""

    baseline: tuple[str, ...]
    candidate: tuple[str, ...]
    ops: tuple[TransformOp, ...]
    kinds: tuple[str, ...] = ("param",)
    slots: tuple[tuple[str, str], ...] = ()
    broadcast: bool = False
    reversed: bool = False
    where: str = ""
    optional: bool = False


@dataclass(frozen=True)
class LayoutRule:
    """One-to-one layout change of records whose name matches ``match`` (a glob on the
    names of ``side``), e.g. Megatron's ``[s, b, h]`` vs HF's ``[b, s, h]``."""

    match: str
    kinds: tuple[str, ...]
    ops: tuple[TransformOp, ...]  # baseline layout -> candidate layout (unless reversed)
    side: str = "candidate"
    reversed: bool = False
    where: str = field(default="", compare=False)
    optional: bool = False


@dataclass(frozen=True)
class SlotRule:
    """Records of modules matching ``match`` (names of ``side``) call a tensor
    ``candidate`` where the baseline calls it ``baseline`` (e.g. ``in.0`` vs
    ``in.hidden_states``, a positional vs a keyword argument)."""

    match: str
    candidate: str
    baseline: str
    side: str = "candidate"
    where: str = field(default="", compare=False)
    optional: bool = False


@dataclass(frozen=True)
class UnmatchedRule:
    """Known one-sided records: why a module has no counterpart."""

    side: str  # baseline | candidate
    match: str
    reason: str


@dataclass(frozen=True)
class MappingSpec:
    name: str
    renames: tuple[NameRule, ...] = ()
    tensors: tuple[TensorRule, ...] = ()
    layouts: tuple[LayoutRule, ...] = ()
    slots: tuple[SlotRule, ...] = ()
    unmatched: tuple[UnmatchedRule, ...] = ()
    where: str = ""
    # msprobe's layer_mapping (class-keyed renames), applied before ``renames``.
    layer_mapping: LayerMapping | None = None


_OTHER = {"baseline": "candidate", "candidate": "baseline"}


def reverse(mapping: MappingSpec) -> MappingSpec:
    """The same mapping used the other way round (baseline and candidate swap roles)."""
    return MappingSpec(
        name=mapping.name + " (reversed)",
        renames=tuple(replace(r, baseline=r.candidate, candidate=r.baseline) for r in mapping.renames),
        tensors=tuple(
            TensorRule(
                baseline=r.candidate,
                candidate=r.baseline,
                ops=r.ops,
                kinds=r.kinds,
                slots=tuple((b, c) for c, b in r.slots),
                broadcast=r.broadcast,
                reversed=not r.reversed,
                where=r.where,
                optional=r.optional,
            )
            for r in mapping.tensors
        ),
        layouts=tuple(replace(r, side=_OTHER[r.side], reversed=not r.reversed) for r in mapping.layouts),
        slots=tuple(
            replace(r, candidate=r.baseline, baseline=r.candidate, side=_OTHER[r.side]) for r in mapping.slots
        ),
        unmatched=tuple(UnmatchedRule(_OTHER[r.side], r.match, r.reason) for r in mapping.unmatched),
        where=mapping.where,
    )


# -- name patterns ---------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _compile(pattern: str, prefix: bool) -> re.Pattern[str]:
    parts = []
    last = 0
    for m in _PLACEHOLDER.finditer(pattern):
        parts.append(re.escape(pattern[last : m.start()]))
        parts.append(f"(?P<{m.group(1)}>[^.]+)")
        last = m.end()
    parts.append(re.escape(pattern[last:]))
    tail = r"(?=\.|$)" if prefix else "$"
    return re.compile("^" + "".join(parts) + tail)


def match_pattern(pattern: str, name: str) -> dict[str, str] | None:
    """Bindings of the placeholders when ``name`` matches ``pattern`` exactly."""
    m = _compile(pattern, False).match(name)
    return m.groupdict() if m else None


def fill_pattern(pattern: str, bindings: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: bindings[m.group(1)], pattern)


def _rename(rules: Iterable[tuple[str, str]], name: str, applied: set[RuleKey] | None = None) -> str:
    for index, (src, dst) in enumerate(rules):
        m = _compile(src, True).match(name)
        if m:
            if applied is not None:
                applied.add(("renames", str(index)))
            return fill_pattern(dst, m.groupdict()) + name[m.end() :]
    return name


def to_baseline_name(
    mapping: MappingSpec | None,
    candidate_name: str,
    class_of: Callable[[str], str | None] | None = None,
    applied: set[RuleKey] | None = None,
) -> str:
    """The baseline's name for a candidate module or parameter; ``class_of`` (candidate
    module path -> class name) is needed by a layer_mapping. The rules that renamed it are
    added to ``applied`` (see ``mapping.usage``)."""
    if mapping is None:
        return candidate_name
    if mapping.layer_mapping is not None and class_of is not None:
        candidate_name = mapping.layer_mapping.to_baseline(candidate_name, class_of, applied)
    return _rename(((r.candidate, r.baseline) for r in mapping.renames), candidate_name, applied)


def to_candidate_name(mapping: MappingSpec | None, baseline_name: str) -> str:
    if mapping is None:
        return baseline_name
    return _rename(((r.baseline, r.candidate) for r in mapping.renames), baseline_name)


def baseline_param_names(mapping: MappingSpec | None, candidate_name: str) -> tuple[str, ...]:
    """The baseline's parameter names for a candidate parameter: a tensor rule's baseline
    tensors (a fused qkv weight stands for q, k and v), else the renamed name."""
    if mapping is not None:
        for rule in mapping.tensors:
            if "param" not in rule.kinds or len(rule.candidate) != 1:
                continue
            bound = match_pattern(rule.candidate[0], candidate_name)
            if bound is not None:
                return tuple(fill_pattern(p, bound) for p in rule.baseline)
    return (to_baseline_name(mapping, candidate_name),)


# -- parsing ----------------------------------------------------------------------------


def _patterns(reader: Reader, key: str) -> tuple[str, ...]:
    value = reader.require(key)
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        reader.fail("expected a name pattern or a non-empty list of them", key)
    return tuple(values)


_INT_PARAMS = {"dim", "dim0", "dim1", "num_heads", "num_kv_heads", "size"}


def _parse_op(reader: Reader, variables: Mapping[str, Any]) -> TransformOp:
    name = reader.get_choice("op", tuple(OP_PARAMS), None)
    if name is None:
        reader.fail(f"missing required key 'op' (allowed: {', '.join(OP_PARAMS)})")
    required, optional = OP_PARAMS[name]
    reader.check_keys(("op", *required, *optional))
    params = []
    for key in required:
        params.append((key, _resolve(reader, key, reader.require(key), variables)))
    for key in optional:
        if reader.has(key):
            params.append((key, _resolve(reader, key, reader.raw(key), variables)))
    reader.done()
    for key, value in params:
        ok = (
            isinstance(value, int) and not isinstance(value, bool)
            if key in _INT_PARAMS
            else isinstance(value, list)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
        if not ok:
            kind = "an integer" if key in _INT_PARAMS else "a list of integers"
            reader.fail(f"expected {kind}, got {value!r}", key)
    op = TransformOp(name, tuple(params))
    if name == "qkv_fuse":
        problem = check_qkv(op)
        if problem:
            reader.fail(problem)
    return op


def _resolve(reader: Reader, key: str, value: Any, variables: Mapping[str, Any]) -> Any:
    """``$name`` stands for a value the mapping is instantiated with (e.g. head counts)."""
    if isinstance(value, str) and value.startswith("$"):
        if value[1:] not in variables:
            known = ", ".join("$" + k for k in variables) or "none"
            reader.fail(f"unknown variable {value!r} (known here: {known})", key)
        return variables[value[1:]]
    return value


def _placeholders(pattern: str) -> str:
    names = sorted(set(_PLACEHOLDER.findall(pattern)))
    return ", ".join("{" + n + "}" for n in names) or "none"


def _ops(r: Reader, key: str, line: int | None, variables: Mapping[str, Any]) -> tuple[TransformOp, ...]:
    ops_value = r.require(key)
    if not isinstance(ops_value, (dict, list)):
        r.fail(f"expected an op ({{op: ...}}) or a list of ops, got {describe(ops_value)}", key)
    ops_list = ops_value if isinstance(ops_value, list) else [ops_value]
    lines = getattr(ops_value, "item_lines", None)
    return tuple(
        _parse_op(r.child(key, {}).child(j, op, lines[j] if lines else line), variables)
        for j, op in enumerate(ops_list)
    )


def _kinds(r: Reader, default: Sequence[str]) -> tuple[str, ...]:
    kinds_value = r.raw("kinds", list(default))
    kinds = tuple(kinds_value if isinstance(kinds_value, list) else [kinds_value])
    for kind in kinds:
        if kind not in KINDS:
            r.fail(f"unknown record kind {kind!r} (allowed: {', '.join(KINDS)})", "kinds")
    return kinds


def _slot_pairs(r: Reader) -> tuple[tuple[str, str], ...]:
    value = r.raw("slots")
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        r.fail("expected a mapping of candidate slot -> baseline slot (e.g. {out.0: out})", "slots")
    return tuple(value.items())


def parse_mapping(name: str, reader: Reader, variables: Mapping[str, Any] | None = None) -> MappingSpec:
    """Parse a mapping; ``$name`` values in transform parameters come from ``variables``."""
    variables = variables or {}
    reader.check_keys(("renames", "tensors", "layouts", "slots", "unmatched"))
    renames = [_name_rule(r) for r, _ in _entries(reader, "renames")]
    tensors = [_tensor_rule(r, line, variables) for r, line in _entries(reader, "tensors")]
    layouts = [_layout_rule(r, line, variables) for r, line in _entries(reader, "layouts")]
    slot_rules = [_slot_rule(r) for r, _ in _entries(reader, "slots")]
    unmatched = [_unmatched_rule(r) for r, _ in _entries(reader, "unmatched")]
    reader.done()
    return MappingSpec(
        name=name,
        renames=tuple(renames),
        tensors=tuple(tensors),
        layouts=tuple(layouts),
        slots=tuple(slot_rules),
        unmatched=tuple(unmatched),
        where=reader.where(),
    )


def _entries(reader: Reader, key: str) -> Iterator[tuple[Reader, int | None]]:
    """A reader for each item of the list under ``key``, with the item's line."""
    for i, item, line in reader.items(key):
        yield reader.child(key, {}).child(i, item, line), line


def _name_rule(r: Reader) -> NameRule:
    r.check_keys(("baseline", "candidate", "optional"))
    baseline, candidate = r.get_str("baseline", required=True), r.get_str("candidate", required=True)
    optional = r.get_bool("optional", False)
    if sorted(set(_PLACEHOLDER.findall(baseline))) != sorted(set(_PLACEHOLDER.findall(candidate))):
        r.fail(
            "baseline and candidate must use the same {placeholders} "
            f"(baseline has {_placeholders(baseline)}, candidate has {_placeholders(candidate)})"
        )
    r.done()
    return NameRule(baseline=baseline, candidate=candidate, where=r.where(), optional=optional)


def _tensor_rule(r: Reader, line: int | None, variables: Mapping[str, Any]) -> TensorRule:
    r.check_keys(("baseline", "candidate", "transform", "kinds", "slots", "broadcast", "optional", "each"))
    baseline, candidate = _patterns(r, "baseline"), _patterns(r, "candidate")
    if r.has("each"):
        placeholder, count = _each(r, variables)
        baseline, candidate = _repeat(baseline, placeholder, count), _repeat(candidate, placeholder, count)
    ops = _ops(r, "transform", line, variables)
    kinds = _kinds(r, ["param"])
    slots = _slot_pairs(r)
    broadcast = r.get_bool("broadcast", False)
    optional = r.get_bool("optional", False)
    r.done()
    if broadcast:
        if len(candidate) != 1:
            r.fail("broadcast rules name exactly one candidate tensor", "candidate")
        _check_arity(r, ops, 1, 1)
    else:
        _check_arity(r, ops, len(baseline), len(candidate))
    return TensorRule(baseline, candidate, ops, kinds, slots, broadcast, False, r.where(), optional)


def _each(r: Reader, variables: Mapping[str, Any]) -> tuple[str, int]:
    """``each: {e: $num_experts}``: the rule's patterns naming ``{e}`` stand for e = 0..n-1."""
    value = r.raw("each")
    if not isinstance(value, dict) or len(value) != 1:
        r.fail("expected one placeholder and its count, e.g. {e: $num_experts}", "each")
    ((placeholder, raw),) = value.items()
    count = _resolve(r, "each", raw, variables)
    if not isinstance(placeholder, str) or not isinstance(count, int) or isinstance(count, bool) or count < 1:
        r.fail(f"expected a placeholder name and a count >= 1, got {placeholder}: {count!r}", "each")
    return placeholder, count


def _repeat(patterns: tuple[str, ...], placeholder: str, count: int) -> tuple[str, ...]:
    mark = "{" + placeholder + "}"
    return tuple(p.replace(mark, str(k)) for p in patterns for k in (range(count) if mark in p else (0,)))


def _layout_rule(r: Reader, line: int | None, variables: Mapping[str, Any]) -> LayoutRule:
    r.check_keys(("candidate", "kinds", "transform", "optional"))
    match = r.get_str("candidate", required=True)
    ops = _ops(r, "transform", line, variables)
    kinds = _kinds(r, MODULE_KINDS)
    optional = r.get_bool("optional", False)
    r.done()
    _check_arity(r, ops, 1, 1)
    return LayoutRule(match, kinds, ops, where=r.where(), optional=optional)


def _slot_rule(r: Reader) -> SlotRule:
    r.check_keys(("candidate", "from", "to", "optional"))
    rule = SlotRule(
        r.get_str("candidate", required=True),
        r.get_str("from", required=True),
        r.get_str("to", required=True),
        where=r.where(),
        optional=r.get_bool("optional", False),
    )
    r.done()
    return rule


def _unmatched_rule(r: Reader) -> UnmatchedRule:
    r.check_keys(("baseline", "candidate", "reason"))
    sides = [side for side in ("baseline", "candidate") if r.has(side)]
    if len(sides) != 1:
        r.fail("name exactly one of 'baseline' or 'candidate' (a glob) and a 'reason'")
    rule = UnmatchedRule(sides[0], r.get_str(sides[0], required=True), r.get_str("reason", required=True))
    r.done()
    return rule


def _check_arity(reader: Reader, ops: Sequence[TransformOp], n_in: int, n_out: int) -> None:
    count = n_in
    for op in ops:
        need, give = OP_ARITY[op.op]
        if need is not None and count != need:
            reader.fail(f"op {op.op!r} takes {need} tensor(s) but gets {count}", "transform")
        if op.op == "split":
            count = len(op.param("sizes"))
        elif op.op == "unbind":
            count = int(op.param("size"))
        elif give is not None:
            count = give
    if count != n_out:
        reader.fail(f"the transform yields {count} tensor(s) but 'candidate' names {n_out}", "transform")


def read_mapping_file(path: Path, name: str, variables: Mapping[str, Any] | None = None) -> MappingSpec:
    data = read_yaml_file(path.resolve())
    return parse_mapping(name, Reader(data, str(path.resolve()), "", 1), variables)
