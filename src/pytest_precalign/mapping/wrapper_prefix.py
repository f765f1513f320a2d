"""A constant wrapper prefix between two recordings: every name of one side is the other's
behind ``model.`` (a LightningModule's attribute), ``module.`` (DDP), ``base_model.model.``
(PEFT), ``_orig_mod.`` (torch.compile) or ``_fsdp_wrapped_module.`` (FSDP).

``precalign compare`` without ``--mapping`` finds such a prefix when the names barely pair as
they are and pair once it is taken off one side, and compares with it taken off, saying so in
one line that also names how to record without it.
"""

from __future__ import annotations

from collections.abc import Iterable

from .spec import MappingSpec, NameRule

KNOWN_WRAPPERS = ("module.", "model.", "base_model.model.", "_orig_mod.", "_fsdp_wrapped_module.")
PAIRED_ENOUGH = 0.5  # the names pair as they are when this share of the smaller side does


def wrapper_prefix(baseline: Iterable[str], candidate: Iterable[str]) -> tuple[str, str] | None:
    """``(side, prefix)``: ``side``'s names are the other side's behind ``prefix``, or None
    (the names pair already, or no one prefix makes them pair)."""
    base, cand = set(baseline) - {""}, set(candidate) - {""}
    if not base or not cand:
        return None
    if len(base & cand) >= PAIRED_ENOUGH * min(len(base), len(cand)):
        return None
    best: tuple[int, str, str] | None = None
    for side, mine, other in (("candidate", cand, base), ("baseline", base, cand)):
        prefixes = set(KNOWN_WRAPPERS) | {n.split(".", 1)[0] + "." for n in mine if "." in n}
        for prefix in sorted(prefixes):
            inside = {n[len(prefix) :] for n in mine if n.startswith(prefix)}
            overlap = len(inside & other)
            if overlap >= PAIRED_ENOUGH * min(len(mine), len(other)) and (best is None or overlap > best[0]):
                best = (overlap, side, prefix)
    return None if best is None else (best[1], best[2])


def prefix_mapping(side: str, prefix: str, other_names: Iterable[str]) -> MappingSpec:
    """Renames that take ``prefix`` off ``side``'s names: one rule per top-level name of the
    other side (a rename maps a prefix of whole dotted segments)."""
    tops = sorted({n.split(".", 1)[0] for n in other_names if n})
    where = f"found by precalign compare: {side} prefix {prefix!r}"
    if side == "candidate":
        rules = tuple(NameRule(baseline=t, candidate=prefix + t, where=where, optional=True) for t in tops)
    else:
        rules = tuple(NameRule(baseline=prefix + t, candidate=t, where=where, optional=True) for t in tops)
    return MappingSpec(name=f"wrapper prefix {prefix!r} ({side})", renames=rules, where=where)


# How a recorder (the manifest's ``training.trainer``) records the unwrapped model.
_UNWRAPPED = {"lightning": 'record it with PrecalignLightningCallback(..., module="{module}")'}


def prefix_note(side: str, prefix: str, trainer: str | None) -> str:
    """The one line that says a prefix was taken off, and how to record without it."""
    other = "baseline" if side == "candidate" else "candidate"
    fix = _UNWRAPPED.get(trainer or "", "record the unwrapped model").format(module=prefix.rstrip("."))
    return (
        f"names: every {side} name is {prefix!r} + the {other}'s (a wrapper): compared with {prefix!r} "
        f"taken off the {side}'s names; to pair them without it, {fix}, or pass --mapping"
    )
