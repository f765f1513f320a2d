"""Mapping rules must bite: a rule that applied to no record and no parameter of a case is an
error naming its file:line and what it was meant to match (a rule with ``optional: true``, or
a layer_mapping entry whose target ends in ``(optional)``, may apply to nothing).

Decided once per case, after the mapping has been applied to all its records (both sides, all
phases and steps) and, with weight sync, to the models' parameters. A rule is judged only when
the case had something it could apply to: a ``tensors``/``layouts`` rule when records of one of
its kinds were recorded (``param`` also by weight sync), a ``slots`` rule when records of its
slot's family (``in...``/``out...``) were, renames and layer_mapping entries always.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass

from ..errors import ConfigError
from ..trace.records import Trace
from ..vocabulary import MODULE_KINDS
from .layer_mapping import RuleKey
from .spec import MappingSpec, match_pattern

_HINT = "set optional: true on a rule that may apply to nothing"


@dataclass(frozen=True)
class MappingUse:
    """What a mapping was applied to: the rules that matched, and what the candidate offered
    (record kinds, slot families, module classes, names -> kinds). Uses of one mapping on parts
    of a case (e.g. each step and rank of ``precalign compare``) combine with ``|``."""

    mapping: MappingSpec | None
    applied: frozenset[RuleKey]
    params_seen: bool  # the mapping was applied to parameters (weight sync)
    kinds: frozenset[str]
    families: frozenset[str]  # first slot segments of module records: in, out
    classes: frozenset[str]
    names: Mapping[str, frozenset[str]]  # candidate record name -> its kinds

    @classmethod
    def of(
        cls, mapping: MappingSpec | None, candidate: Trace, applied: Set[RuleKey], *, params_seen: bool
    ) -> MappingUse:
        """``candidate``: the trace the mapping was applied to, in its own names."""
        names: dict[str, set[str]] = {}
        for r in candidate.records:
            names.setdefault(r.name, set()).add(r.kind)
        return cls(
            mapping,
            frozenset(applied),
            params_seen,
            frozenset(r.kind for r in candidate.records) | ({"param"} if params_seen else frozenset()),
            frozenset(r.slot.split(".")[0] for r in candidate.records if r.kind in MODULE_KINDS),
            frozenset(r.module_class for r in candidate.records),
            {n: frozenset(k) for n, k in names.items()},
        )

    def __or__(self, other: MappingUse) -> MappingUse:
        names = dict(self.names)
        for n, k in other.names.items():
            names[n] = names.get(n, frozenset()) | k
        return MappingUse(
            self.mapping,
            self.applied | other.applied,
            self.params_seen or other.params_seen,
            self.kinds | other.kinds,
            self.families | other.families,
            self.classes | other.classes,
            names,
        )


def check_applied(use: MappingUse) -> None:
    """Raise one ``ConfigError`` naming the first rule of the mapping that applied to nothing
    (and how many more there are)."""
    if use.mapping is None:
        return
    problems = list(_unapplied(use.mapping, use))
    if not problems:
        return
    message = problems[0]
    if len(problems) > 1:
        others = ", ".join(p.split(": ", 1)[0] for p in problems[1:6])
        more = " ..." if len(problems) > 6 else ""
        message += f"; {len(problems) - 1} more rule(s) matched nothing: {others}{more}"
    raise ConfigError(message)


def _unapplied(mapping: MappingSpec, use: MappingUse) -> Iterator[str]:
    applied, kinds = use.applied, use.kinds
    what = "record or parameter" if use.params_seen else "record"
    if mapping.layer_mapping is not None:
        lm = mapping.layer_mapping
        for cls, entries in lm.rules.items():
            for segments, target in entries:
                key = ("layer_mapping", f"{cls}: {'.'.join(segments)}")
                if key in applied or key in lm.optional:
                    continue
                absent = (
                    "" if cls == "TopLayer" or cls in use.classes else f"; no candidate module is a {cls}"
                )
                yield (
                    f"{lm.lines.get(key, lm.where)}: layer_mapping entry {cls}: "
                    f"'{'.'.join(segments)}: {target}' matched no {what}{absent} (mark it "
                    f"'{target}(optional)' if it may apply to nothing)"
                )
    for i, rename in enumerate(mapping.renames):
        if ("renames", str(i)) not in applied and not rename.optional:
            yield (
                f"{rename.where or mapping.where}: renames rule {rename.candidate!r} -> {rename.baseline!r} "
                f"matched no {what} ({_HINT})"
            )
    yield from _unapplied_tensors(mapping, use, what)
    for i, layout in enumerate(mapping.layouts):
        if ("layouts", str(i)) not in applied and not layout.optional and kinds & set(layout.kinds):
            yield (
                f"{layout.where or mapping.where}: layouts rule {layout.match!r} matched no record "
                f"(kinds [{', '.join(layout.kinds)}]; {_HINT})"
            )
    for i, slot in enumerate(mapping.slots):
        judged = slot.candidate.split(".")[0] in use.families
        if ("slots", str(i)) not in applied and not slot.optional and judged:
            yield (
                f"{slot.where or mapping.where}: slots rule {slot.match!r} (from {slot.candidate}) "
                f"matched no record ({_HINT})"
            )


def _unapplied_tensors(mapping: MappingSpec, use: MappingUse, what: str) -> Iterator[str]:
    for i, rule in enumerate(mapping.tensors):
        rule_kinds = set(rule.kinds) | ({"param_grad"} if "param" in rule.kinds else set())
        if ("tensors", str(i)) in use.applied or rule.optional or not use.kinds & rule_kinds:
            continue
        names = rule.candidate[0] if len(rule.candidate) == 1 else list(rule.candidate)
        found = [
            k for n, k in use.names.items() if any(match_pattern(p, n) is not None for p in rule.candidate)
        ]
        elsewhere = sorted(set().union(*found) - rule_kinds)
        hint = f"; did you mean kinds: [{', '.join(elsewhere)}]?" if elsewhere else f"; {_HINT}"
        yield (
            f"{rule.where or mapping.where}: tensors rule {names!r} matched no {what} "
            f"(kinds [{', '.join(rule.kinds)}]{hint})"
        )
