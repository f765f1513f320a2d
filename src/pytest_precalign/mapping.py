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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CaseError
from .tolerances import KINDS
from .trace import Trace
from .yamlio import Reader, describe, read_yaml_file

if TYPE_CHECKING:
    import torch

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class NameRule:
    baseline: str
    candidate: str


@dataclass(frozen=True)
class TransformOp:
    op: str
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


@dataclass(frozen=True)
class TensorRule:
    """``baseline`` tensors --ops--> ``candidate`` tensors, for the given record kinds."""

    baseline: tuple[str, ...]
    candidate: tuple[str, ...]
    ops: tuple[TransformOp, ...]
    kinds: tuple[str, ...] = ("param",)
    where: str = ""


@dataclass(frozen=True)
class MappingSpec:
    name: str
    renames: tuple[NameRule, ...] = ()
    tensors: tuple[TensorRule, ...] = ()
    where: str = ""


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


def _rename(rules: Iterable[tuple[str, str]], name: str) -> str:
    for src, dst in rules:
        m = _compile(src, True).match(name)
        if m:
            return fill_pattern(dst, m.groupdict()) + name[m.end() :]
    return name


def to_baseline_name(mapping: MappingSpec | None, candidate_name: str) -> str:
    if mapping is None:
        return candidate_name
    return _rename(((r.candidate, r.baseline) for r in mapping.renames), candidate_name)


def to_candidate_name(mapping: MappingSpec | None, baseline_name: str) -> str:
    if mapping is None:
        return baseline_name
    return _rename(((r.baseline, r.candidate) for r in mapping.renames), baseline_name)


# -- tensor ops -------------------------------------------------------------------------

Tensors = list["torch.Tensor"]


def _qkv_fuse(ts: Tensors, op: TransformOp) -> Tensors:
    import torch

    q, k, v = ts
    dim = int(op.param("dim", 0))
    heads, groups = int(op.param("num_heads")), int(op.param("num_kv_heads"))
    per = heads // groups
    d = q.shape[dim] // heads
    qs = q.unflatten(dim, (groups, per * d))
    ks = k.unflatten(dim, (groups, d))
    vs = v.unflatten(dim, (groups, d))
    return [torch.cat([qs, ks, vs], dim=dim + 1).flatten(dim, dim + 1)]


def _qkv_split(ts: Tensors, op: TransformOp) -> Tensors:
    (fused,) = ts
    dim = int(op.param("dim", 0))
    heads, groups = int(op.param("num_heads")), int(op.param("num_kv_heads"))
    per = heads // groups
    total = fused.shape[dim]
    d = total // (heads + 2 * groups)
    grouped = fused.unflatten(dim, (groups, (per + 2) * d))
    q, k, v = grouped.split([per * d, d, d], dim=dim + 1)
    return [t.flatten(dim, dim + 1) for t in (q, k, v)]


def _check_qkv(op: TransformOp) -> str | None:
    heads, groups = op.param("num_heads"), op.param("num_kv_heads")
    if not isinstance(heads, int) or not isinstance(groups, int) or heads <= 0 or groups <= 0:
        return "qkv_fuse needs positive integers num_heads and num_kv_heads"
    if heads % groups:
        return f"num_heads ({heads}) must be a multiple of num_kv_heads ({groups})"
    return None


def _forward(op: TransformOp, ts: Tensors) -> Tensors:
    import torch

    name = op.op
    if name == "concat":
        return [torch.cat(ts, dim=int(op.param("dim", 0)))]
    if name == "split":
        return list(ts[0].split(list(op.param("sizes")), dim=int(op.param("dim", 0))))
    if name == "permute":
        return [t.permute(*op.param("dims")) for t in ts]
    if name == "transpose":
        return [t.transpose(int(op.param("dim0")), int(op.param("dim1"))) for t in ts]
    if name == "reshape":
        return [t.reshape(*op.param("shape")) for t in ts]
    if name == "qkv_fuse":
        return _qkv_fuse(ts, op)
    raise CaseError(f"unknown transform op {name!r}")


def _inverse(op: TransformOp, ts: Tensors, inputs: Sequence[torch.Size]) -> Tensors:
    """Undo ``op``; ``inputs`` are the shapes its forward direction took."""
    import torch

    name = op.op
    if name == "concat":
        dim = int(op.param("dim", 0))
        return list(ts[0].split([s[dim] for s in inputs], dim=dim))
    if name == "split":
        return [torch.cat(ts, dim=int(op.param("dim", 0)))]
    if name == "permute":
        dims = list(op.param("dims"))
        inverse = [dims.index(i) for i in range(len(dims))]
        return [t.permute(*inverse) for t in ts]
    if name == "transpose":
        return [t.transpose(int(op.param("dim0")), int(op.param("dim1"))) for t in ts]
    if name == "reshape":
        return [t.reshape(shape) for t, shape in zip(ts, inputs, strict=True)]
    if name == "qkv_fuse":
        return _qkv_split(ts, op)
    raise CaseError(f"unknown transform op {name!r}")


_OP_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # op: (required params, optional params)
    "concat": ((), ("dim",)),
    "split": (("sizes",), ("dim",)),
    "permute": (("dims",), ()),
    "transpose": (("dim0", "dim1"), ()),
    "reshape": (("shape",), ()),
    "qkv_fuse": (("num_heads", "num_kv_heads"), ("dim",)),
}
_OP_ARITY: dict[str, tuple[int | None, int | None]] = {
    # op: (inputs, outputs); None = any number (one-to-one per tensor when both None)
    "concat": (None, 1),
    "split": (1, None),
    "permute": (None, None),
    "transpose": (None, None),
    "reshape": (None, None),
    "qkv_fuse": (3, 1),
}


def apply_forward(rule: TensorRule, tensors: Tensors) -> Tensors:
    """Baseline tensors -> candidate tensors."""
    out = list(tensors)
    for op in rule.ops:
        out = _forward(op, out)
    return out


def apply_inverse(rule: TensorRule, tensors: Tensors, baseline_shapes: Sequence[Sequence[int]]) -> Tensors:
    """Candidate tensors -> baseline tensors, given the baseline shapes (they fix split sizes)."""
    import torch

    # Replay the forward chain on meta tensors to learn each op's input shapes.
    metas: Tensors = [torch.empty(tuple(s), device="meta") for s in baseline_shapes]
    shapes_before: list[list[torch.Size]] = []
    for op in rule.ops:
        shapes_before.append([t.shape for t in metas])
        metas = _forward(op, metas)
    out = list(tensors)
    for op, shapes in zip(reversed(rule.ops), reversed(shapes_before), strict=True):
        out = _inverse(op, out, shapes)
    return out


# -- parsing ----------------------------------------------------------------------------


def _patterns(reader: Reader, key: str) -> tuple[str, ...]:
    value = reader.require(key)
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        reader.fail("expected a name pattern or a non-empty list of them", key)
    return tuple(values)


def _parse_op(reader: Reader) -> TransformOp:
    name = reader.get_choice("op", tuple(_OP_PARAMS), None)
    if name is None:
        reader.fail(f"missing required key 'op' (allowed: {', '.join(_OP_PARAMS)})")
    required, optional = _OP_PARAMS[name]
    reader.check_keys(("op", *required, *optional))
    params = []
    for key in required:
        params.append((key, reader.require(key)))
    for key in optional:
        if reader.has(key):
            params.append((key, reader.raw(key)))
    reader.done()
    for key, value in params:
        ok = (
            isinstance(value, int) and not isinstance(value, bool)
            if key in {"dim", "dim0", "dim1", "num_heads", "num_kv_heads"}
            else isinstance(value, list)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
        if not ok:
            kind = (
                "an integer"
                if key in {"dim", "dim0", "dim1", "num_heads", "num_kv_heads"}
                else "a list of integers"
            )
            reader.fail(f"expected {kind}, got {value!r}", key)
    op = TransformOp(name, tuple(params))
    if name == "qkv_fuse":
        problem = _check_qkv(op)
        if problem:
            reader.fail(problem)
    return op


def _placeholders(pattern: str) -> str:
    names = sorted(set(_PLACEHOLDER.findall(pattern)))
    return ", ".join("{" + n + "}" for n in names) or "none"


def parse_mapping(name: str, reader: Reader) -> MappingSpec:
    reader.check_keys(("renames", "tensors"))
    renames = []
    for i, item, line in reader.items("renames"):
        r = reader.child("renames", {}).child(i, item, line)
        r.check_keys(("baseline", "candidate"))
        baseline, candidate = r.get_str("baseline", required=True), r.get_str("candidate", required=True)
        if sorted(set(_PLACEHOLDER.findall(baseline))) != sorted(set(_PLACEHOLDER.findall(candidate))):
            r.fail(
                "baseline and candidate must use the same {placeholders} "
                f"(baseline has {_placeholders(baseline)}, candidate has {_placeholders(candidate)})"
            )
        r.done()
        renames.append(NameRule(baseline=baseline, candidate=candidate))
    tensors = []
    for i, item, line in reader.items("tensors"):
        r = reader.child("tensors", {}).child(i, item, line)
        r.check_keys(("baseline", "candidate", "transform", "kinds"))
        baseline, candidate = _patterns(r, "baseline"), _patterns(r, "candidate")
        ops_value = r.require("transform")
        if not isinstance(ops_value, (dict, list)):
            r.fail(f"expected an op ({{op: ...}}) or a list of ops, got {describe(ops_value)}", "transform")
        ops_list = ops_value if isinstance(ops_value, list) else [ops_value]
        lines = getattr(ops_value, "item_lines", None)
        ops = tuple(
            _parse_op(r.child("transform", {}).child(j, op, lines[j] if lines else line))
            for j, op in enumerate(ops_list)
        )
        kinds_value = r.raw("kinds", ["param"])
        kinds = tuple(kinds_value if isinstance(kinds_value, list) else [kinds_value])
        for kind in kinds:
            if kind not in KINDS:
                r.fail(f"unknown record kind {kind!r} (allowed: {', '.join(KINDS)})", "kinds")
        r.done()
        _check_arity(r, ops, len(baseline), len(candidate))
        tensors.append(TensorRule(baseline, candidate, ops, kinds, r.where()))
    reader.done()
    return MappingSpec(name=name, renames=tuple(renames), tensors=tuple(tensors), where=reader.where())


def _check_arity(reader: Reader, ops: Sequence[TransformOp], n_in: int, n_out: int) -> None:
    count = n_in
    for op in ops:
        need, give = _OP_ARITY[op.op]
        if need is not None and count != need:
            reader.fail(f"op {op.op!r} takes {need} tensor(s) but gets {count}", "transform")
        if op.op == "split":
            count = len(op.param("sizes"))
        elif give is not None:
            count = give
    if count != n_out:
        reader.fail(f"the transform yields {count} tensor(s) but 'candidate' names {n_out}", "transform")


def read_mapping_file(path: Path, name: str) -> MappingSpec:
    data = read_yaml_file(path.resolve())
    return parse_mapping(name, Reader(data, str(path.resolve()), "", 1))


# -- weight sync ------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncReport:
    copied: int
    transformed: int
    unsynced: tuple[str, ...]  # candidate parameters nothing was copied into
    unused: tuple[str, ...]  # baseline parameters nothing read

    def lines(self) -> list[str]:
        out = [f"weights: {self.copied} copied by name, {self.transformed} through transforms"]
        if self.unsynced:
            out.append(f"  candidate parameters left as built: {', '.join(self.unsynced[:10])}")
        if self.unused:
            out.append(f"  baseline parameters not used: {', '.join(self.unused[:10])}")
        return out


def expand_rule(rule: TensorRule, names: Iterable[str]) -> list[tuple[list[str], list[str]]]:
    """Instances of a rule: (baseline names, candidate names) per placeholder binding."""
    names = list(names)
    seen: set[tuple[tuple[str, str], ...]] = set()
    out = []
    for name in names:
        bindings = match_pattern(rule.baseline[0], name)
        if bindings is None:
            continue
        key = tuple(sorted(bindings.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            (
                [fill_pattern(p, bindings) for p in rule.baseline],
                [fill_pattern(p, bindings) for p in rule.candidate],
            )
        )
    return out


def sync_weights(
    baseline: torch.nn.Module,
    candidate: torch.nn.Module,
    mapping: MappingSpec | None,
    *,
    strict: bool,
    context: Callable[[], str] = lambda: "",
) -> SyncReport:
    """Copy the baseline's parameters into the candidate (renames, then tensor rules)."""
    import torch

    source = dict(baseline.named_parameters())
    target = dict(candidate.named_parameters())
    used: set[str] = set()
    done: set[str] = set()
    transformed = 0
    with torch.no_grad():
        for rule in mapping.tensors if mapping else ():
            if "param" not in rule.kinds:
                continue
            for base_names, cand_names in expand_rule(rule, source):
                if not all(n in source for n in base_names):
                    continue
                missing = [n for n in cand_names if n not in target]
                if missing:
                    raise CaseError(f"mapping rule ({rule.where}): candidate has no parameter {missing[0]!r}")
                outs = apply_forward(rule, [source[n] for n in base_names])
                for name, value in zip(cand_names, outs, strict=True):
                    _copy(target[name], value, name, "+".join(base_names))
                    done.add(name)
                used.update(base_names)
                transformed += len(cand_names)
        copied = 0
        for name, param in target.items():
            if name in done:
                continue
            base_name = to_baseline_name(mapping, name)
            if base_name in source:
                _copy(param, source[base_name], name, base_name)
                used.add(base_name)
                done.add(name)
                copied += 1
    unsynced = tuple(n for n in target if n not in done)
    unused = tuple(n for n in source if n not in used)
    report = SyncReport(copied, transformed, unsynced, unused)
    if strict and unsynced:
        raise CaseError(
            f"{context()}weights.sync: {len(unsynced)} candidate parameter(s) have no baseline "
            f"source: {', '.join(unsynced[:5])}"
            + (" ..." if len(unsynced) > 5 else "")
            + " (add renames/tensors to the mapping, or set weights: {strict: false})"
        )
    return report


def _copy(dst: torch.Tensor, src: torch.Tensor, dst_name: str, src_name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise CaseError(
            f"weights.sync: shape mismatch: candidate {dst_name} {tuple(dst.shape)} "
            f"<- baseline {src_name} {tuple(src.shape)}"
        )
    dst.copy_(src.to(device=dst.device))


def map_trace(trace: Trace, mapping: MappingSpec | None) -> Trace:
    """Bring a candidate trace to the baseline's names (records and their dependencies)."""
    if mapping is None or not mapping.renames:
        return trace

    def rename_id(rid: str) -> str:
        name, sep, rest = rid.partition("|")
        return to_baseline_name(mapping, name) + sep + rest

    records = tuple(
        r.renamed(to_baseline_name(mapping, r.name), tuple(rename_id(d) for d in r.deps))
        for r in trace.records
    )
    return Trace(manifest=trace.manifest, records=records, tensors=trace.tensors)
