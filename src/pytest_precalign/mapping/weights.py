"""Weight sync: copy the baseline's parameters into the candidate through a mapping
(renames by name, tensor rules through their transforms), with a report of what was left."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import CaseError
from ..trace.json_fields import field_dict
from .layer_mapping import RuleKey
from .spec import MappingSpec, TensorRule, fill_pattern, match_pattern, to_baseline_name
from .transforms import apply_forward, apply_inverse, transform_error

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SyncReport:
    copied: int
    transformed: int
    unsynced: tuple[str, ...]  # candidate parameters nothing was copied into
    unused: tuple[str, ...]  # baseline parameters nothing read
    applied: frozenset[RuleKey] = field(default_factory=frozenset)  # mapping rules that matched a parameter

    def as_dict(self) -> dict[str, object]:
        """report.json's ``weights`` entry: counts, and what was left on either side."""
        return field_dict(self, omit=("applied",))


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
    baseline: torch.nn.Module | Mapping[str, torch.Tensor],
    candidate: torch.nn.Module,
    mapping: MappingSpec | None,
    *,
    strict: bool,
    context: Callable[[], str] = lambda: "",
) -> SyncReport:
    """Copy the baseline's parameters into the candidate (renames, then tensor rules). The
    baseline is a module or stored weights (name -> tensor, e.g. a baseline's weights file)."""
    import torch

    source = dict(baseline) if isinstance(baseline, Mapping) else dict(baseline.named_parameters())
    target = dict(candidate.named_parameters())
    classes = {n: type(m).__name__ for n, m in candidate.named_modules()}
    used: set[str] = set()
    done: set[str] = set()
    applied: set[RuleKey] = set()
    transformed = 0
    with torch.no_grad():
        for index, rule in enumerate(mapping.tensors if mapping else ()):
            if "param" not in rule.kinds:
                continue
            for base_names, cand_names in expand_rule(rule, source):
                if not all(n in source for n in base_names):
                    continue
                applied.add(("tensors", str(index)))
                missing = [n for n in cand_names if n not in target]
                if missing:
                    raise CaseError(f"mapping rule ({rule.where}): candidate has no parameter {missing[0]!r}")
                inputs: list[torch.Tensor] = [source[n] for n in base_names]
                outs = _transform(rule, inputs, [tuple(target[n].shape) for n in cand_names], cand_names[0])
                for name, value in zip(cand_names, outs, strict=True):
                    _copy(target[name], value, name, "+".join(base_names))
                    done.add(name)
                used.update(base_names)
                transformed += len(cand_names)
        copied = 0
        for name, param in target.items():
            if name in done:
                continue
            base_name = to_baseline_name(mapping, name, classes.get, applied)
            if base_name in source:
                _copy(param, source[base_name], name, base_name)
                used.add(base_name)
                done.add(name)
                copied += 1
    unsynced = tuple(n for n in target if n not in done)
    unused = tuple(n for n in source if n not in used)
    report = SyncReport(copied, transformed, unsynced, unused, frozenset(applied))
    if strict and (unsynced or unused):
        raise CaseError(context() + strict_message(report, mapping))
    return report


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names[:5]) + (f" ... ({len(names)} in all)" if len(names) > 5 else "")


def strict_message(report: SyncReport, mapping: MappingSpec | None) -> str:
    """Why a strict sync failed: the parameters on either side nothing paired, and the mapping."""
    by = (
        f"mapping {mapping.name!r}" + (f" ({mapping.where})" if mapping.where else "")
        if mapping
        else "no mapping"
    )
    parts = []
    if report.unsynced:
        parts.append(
            f"{len(report.unsynced)} candidate parameter(s) have no baseline source: {_names(report.unsynced)}"
        )
    if report.unused:
        parts.append(f"{len(report.unused)} baseline parameter(s) were not consumed: {_names(report.unused)}")
    return (
        f"weights.sync through {by}: {'; '.join(parts)} (add renames/tensors to the mapping, or set "
        "weights: {strict: false} where the models legitimately differ)"
    )


def _transform(
    rule: TensorRule, inputs: list[torch.Tensor], cand_shapes: list[tuple[int, ...]], cand_name: str
) -> list[torch.Tensor]:
    """Baseline parameters through the rule into the candidate's layout (undone for a rule that
    goes candidate -> baseline); a transform that does not fit the shapes is one message."""
    try:
        if rule.reversed:
            return apply_inverse(rule.ops, inputs, cand_shapes)
        return apply_forward(rule.ops, inputs)
    except (RuntimeError, ValueError, IndexError) as exc:
        names = rule.candidate[0] if len(rule.candidate) == 1 else list(rule.candidate)
        base_shapes = [tuple(t.shape) for t in inputs]
        record = f"parameter {cand_name} (weights.sync)"
        raise transform_error(
            rule.where, f"tensors rule {names!r}", record, cand_shapes, base_shapes, exc
        ) from None


def _copy(dst: torch.Tensor, src: torch.Tensor, dst_name: str, src_name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise CaseError(
            f"weights.sync: shape mismatch: candidate {dst_name} {tuple(dst.shape)} "
            f"<- baseline {src_name} {tuple(src.shape)}"
        )
    dst.copy_(src.to(device=dst.device))
