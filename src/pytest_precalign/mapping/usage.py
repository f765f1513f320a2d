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

from collections.abc import Iterator, Set

from ..errors import ConfigError
from ..trace.records import Trace
from .layer_mapping import RuleKey
from .spec import MappingSpec, match_pattern

_MODULE_KINDS = ("activation", "input", "grad_output", "grad_input")
_HINT = "set optional: true on a rule that may apply to nothing"


def check_applied(
    mapping: MappingSpec | None, applied: Set[RuleKey], candidate: Trace, *, params_seen: bool
) -> None:
    """Raise one ``ConfigError`` naming the first rule of ``mapping`` not in ``applied`` (and how
    many more there are); ``candidate`` is the case's candidate trace in its own names,
    ``params_seen`` whether the mapping was applied to parameters (weight sync)."""
    if mapping is None:
        return
    problems = list(_unapplied(mapping, applied, candidate, params_seen))
    if not problems:
        return
    message = problems[0]
    if len(problems) > 1:
        others = ", ".join(p.split(": ", 1)[0] for p in problems[1:6])
        more = " ..." if len(problems) > 6 else ""
        message += f"; {len(problems) - 1} more rule(s) matched nothing: {others}{more}"
    raise ConfigError(message)


def _unapplied(mapping: MappingSpec, applied: Set[RuleKey], trace: Trace, params_seen: bool) -> Iterator[str]:
    kinds = {r.kind for r in trace.records} | ({"param"} if params_seen else set())
    families = {r.slot.split(".")[0] for r in trace.records if r.kind in _MODULE_KINDS}
    what = "record or parameter" if params_seen else "record"
    if mapping.layer_mapping is not None:
        lm = mapping.layer_mapping
        classes = {r.module_class for r in trace.records}
        for cls, entries in lm.rules.items():
            for segments, target in entries:
                key = ("layer_mapping", f"{cls}: {'.'.join(segments)}")
                if key in applied or key in lm.optional:
                    continue
                absent = "" if cls == "TopLayer" or cls in classes else f"; no candidate module is a {cls}"
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
    yield from _unapplied_tensors(mapping, applied, trace, kinds, what)
    for i, layout in enumerate(mapping.layouts):
        if ("layouts", str(i)) not in applied and not layout.optional and kinds & set(layout.kinds):
            yield (
                f"{layout.where or mapping.where}: layouts rule {layout.match!r} matched no record "
                f"(kinds [{', '.join(layout.kinds)}]; {_HINT})"
            )
    for i, slot in enumerate(mapping.slots):
        judged = slot.candidate.split(".")[0] in families
        if ("slots", str(i)) not in applied and not slot.optional and judged:
            yield (
                f"{slot.where or mapping.where}: slots rule {slot.match!r} (from {slot.candidate}) "
                f"matched no record ({_HINT})"
            )


def _unapplied_tensors(
    mapping: MappingSpec, applied: Set[RuleKey], trace: Trace, kinds: Set[str], what: str
) -> Iterator[str]:
    for i, rule in enumerate(mapping.tensors):
        rule_kinds = set(rule.kinds) | ({"param_grad"} if "param" in rule.kinds else set())
        if ("tensors", str(i)) in applied or rule.optional or not kinds & rule_kinds:
            continue
        names = rule.candidate[0] if len(rule.candidate) == 1 else list(rule.candidate)
        elsewhere = sorted(
            {r.kind for r in trace.records if any(match_pattern(p, r.name) is not None for p in rule.candidate)}
            - rule_kinds
        )
        hint = f"; did you mean kinds: [{', '.join(elsewhere)}]?" if elsewhere else f"; {_HINT}"
        yield (
            f"{rule.where or mapping.where}: tensors rule {names!r} matched no {what} "
            f"(kinds [{', '.join(rule.kinds)}]{hint})"
        )
