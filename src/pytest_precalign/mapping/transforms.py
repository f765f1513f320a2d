"""Invertible tensor transforms between a baseline layout and a candidate layout.

Each op maps a list of tensors to a list of tensors (``concat``, ``split``, ``permute``,
``transpose``, ``reshape``, ``qkv_fuse``, ``unbind``: one tensor of ``size`` slices along
``dim`` <-> ``size`` tensors, e.g. fused experts <-> one weight per expert); a rule's chain of ops is applied forward
(baseline -> candidate) or undone (candidate -> baseline). torch is imported when applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CaseError, ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TransformOp:
    op: str
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


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


def _unbind(ts: Tensors, op: TransformOp) -> Tensors:
    (t,) = ts
    dim, size = int(op.param("dim", 0)), int(op.param("size"))
    if t.shape[dim] != size:
        raise ValueError(f"unbind expects {size} slices along dim {dim}, the tensor has {t.shape[dim]}")
    return list(t.unbind(dim))


def check_qkv(op: TransformOp) -> str | None:
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
    if name == "unbind":
        return _unbind(ts, op)
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
    if name == "unbind":
        return [torch.stack(ts, dim=int(op.param("dim", 0)))]
    raise CaseError(f"unknown transform op {name!r}")


OP_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # op: (required params, optional params)
    "concat": ((), ("dim",)),
    "split": (("sizes",), ("dim",)),
    "permute": (("dims",), ()),
    "transpose": (("dim0", "dim1"), ()),
    "reshape": (("shape",), ()),
    "qkv_fuse": (("num_heads", "num_kv_heads"), ("dim",)),
    "unbind": (("size",), ("dim",)),
}
OP_ARITY: dict[str, tuple[int | None, int | None]] = {
    # op: (inputs, outputs); None = any number (one-to-one per tensor when both None)
    "concat": (None, 1),
    "split": (1, None),
    "permute": (None, None),
    "transpose": (None, None),
    "reshape": (None, None),
    "qkv_fuse": (3, 1),
    "unbind": (1, None),  # as many as its size
}


def apply_forward(ops: Sequence[TransformOp], tensors: Tensors) -> Tensors:
    """Run the chain forward (in a mapping rule: baseline tensors -> candidate tensors)."""
    out = list(tensors)
    for op in ops:
        out = _forward(op, out)
    return out


def apply_inverse(
    ops: Sequence[TransformOp], tensors: Tensors, source_shapes: Sequence[Sequence[int]]
) -> Tensors:
    """Undo the chain, given the shapes the forward direction started from (they fix split
    sizes and reshapes)."""
    import torch

    # Run the forward chain on meta tensors to learn each op's input shapes.
    metas: Tensors = [torch.empty(tuple(s), device="meta") for s in source_shapes]
    shapes_before: list[list[torch.Size]] = []
    for op in ops:
        shapes_before.append([t.shape for t in metas])
        metas = _forward(op, metas)
    out = list(tensors)
    for op, shapes in zip(reversed(ops), reversed(shapes_before), strict=True):
        out = _inverse(op, out, shapes)
    return out


def _shapes(shapes: Sequence[Sequence[int]]) -> str:
    return ", ".join(str(tuple(s)) for s in shapes) or "none"


def transform_error(
    where: str,
    rule: str,
    record: str,
    candidate: Sequence[Sequence[int]],
    baseline: Sequence[Sequence[int]],
    exc: BaseException,
) -> ConfigError:
    """One message for a transform that does not fit the tensors it is given: the mapping's
    file:line, the rule, the record (or parameter) and both sides' shapes."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ConfigError(
        f"{where}: {rule}: the transform does not fit {record}: candidate shape {_shapes(candidate)}, "
        f"baseline shape {_shapes(baseline)} ({detail})"
    )
