"""What an origin claim rests on: the records a failing record was computed from (its
``deps``), each compared or not, matched exactly or within tolerance.

"Origin: its inputs matched" is only said when every input of the record was compared and
passed. An input without a partner (one side recorded it, the other did not: a recompute,
a fused kernel) proves nothing, and an input that passed while it still differed is named
with the size of its difference, next to the output's (amplification).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..compare.pairs import PairResult
from ..trace.records import Record
from ..vocabulary import FAILED
from .non_data_inputs import non_data, set_aside, shown_slot
from .origin_facts import InputsWithinTolerance, MovedInput, MovedOutput, NoPartner


@dataclass(frozen=True)
class InputEvidence:
    """A record's inputs: which have no partner, which differed within tolerance (with their
    relative change), which failed."""

    unmatched: tuple[str, ...] = ()  # record ids of inputs with no partner (or never recorded)
    failed: tuple[str, ...] = ()
    differed: tuple[tuple[str, float], ...] = ()  # (record id, relative change) that still passed
    aside: tuple[str, ...] = ()  # masks, positions, caches whose form changed (non_data_inputs)


def relative_change(pair: PairResult) -> float | None:
    """How much the candidate differs from the baseline, relative to the baseline's size: for
    element-wise evidence the greatest absolute difference over the baseline's largest
    magnitude; for statistics the largest relative change of max/min/norm; None without a
    measure (hashes: equal or not)."""
    base, other = pair.record.stats, pair.candidate.stats if pair.candidate is not None else None
    if pair.closeness is not None:
        scale = max(abs(base.max), abs(base.min)) if base is not None else 0.0
        if scale == scale and 0.0 < scale < float("inf"):
            return pair.closeness.greatest_abs / scale
        return pair.closeness.greatest_rel
    if base is None or other is None:
        return None
    changes = [
        abs(vb - va) / abs(va)
        for va, vb in ((base.max, other.max), (base.min, other.min), (base.norm, other.norm))
        if va == va and vb == vb and abs(va) not in (0.0, float("inf")) and abs(vb) != float("inf")
    ]
    return max(changes, default=None)


def input_evidence(rec: Record, every: Mapping[str, PairResult]) -> InputEvidence:
    """The evidence of ``rec``'s inputs; ``every``: each record id of the comparison (paired
    or one-sided) to its pair."""
    unmatched, failed, differed, aside = [], [], [], []
    for dep in rec.deps:
        pair = every.get(dep)
        if pair is not None and set_aside(pair):
            aside.append(shown_slot(pair.record))
        elif pair is None or not pair.paired:
            unmatched.append(dep)
        elif pair.status in FAILED:
            failed.append(dep)
        else:
            change = relative_change(pair)
            if change:
                differed.append((dep, change))
    return InputEvidence(tuple(unmatched), tuple(failed), tuple(differed), tuple(dict.fromkeys(aside)))


def moved(pair: PairResult) -> bool | None:
    """The candidate differs from the baseline at all (element-wise: any element; statistics:
    any of max/min/mean/norm), whatever the tolerance; None without a measure."""
    if pair.closeness is not None:
        return pair.closeness.greatest_abs != 0.0
    base, other = pair.record.stats, pair.candidate.stats if pair.candidate is not None else None
    if base is None or other is None:
        return None
    pairs = ((base.max, other.max), (base.min, other.min), (base.mean, other.mean), (base.norm, other.norm))
    return any(a != b and not (a != a and b != b) for a, b in pairs)


def first_moved(rec: Record, every: Mapping[str, PairResult]) -> PairResult | None:
    """Where the sides part before ``rec`` in its step and phase: the first paired module output
    that differs at all (``moved``), when every record before it (inputs too) was compared and
    identical, and so were its own inputs, or the first module input to differ at all after
    identical records; None when no such record exists. A mask, position or
    cache input whose form changed between the sides (``non_data_inputs``) is set aside: it
    neither stops the search nor vouches, and a record computed from it is never named."""
    before = sorted(
        (
            p
            for p in every.values()
            if p.record.step == rec.step
            and p.record.phase == rec.phase
            and p.record.seq < rec.seq
            and not set_aside(p)
        ),
        key=lambda p: p.record.seq,
    )
    for pair in before:
        if not pair.paired:
            return None
        change = moved(pair)
        if change is None:
            return None
        if not change:
            continue
        if pair.record.kind == "input" and pair.record.module_class != "api":
            return pair  # made by the enclosing module's own code (``moved_origin``)
        deps = [every.get(d) for d in pair.record.deps]
        if (
            pair.record.kind != "activation"
            or pair.record.module_class == "api"
            or not deps
            or any(d is None or not d.paired or set_aside(d) or moved(d) is not False for d in deps)
        ):
            return None
        return pair
    return None


def moved_origin(
    rec: Record,
    failing: PairResult,
    every: Mapping[str, PairResult],
    ancestors: Callable[[Record], Iterable[str]],
) -> tuple[str, MovedOutput | MovedInput] | None:
    """The module where the sides part before ``rec`` (``first_moved``) and why, or None. An
    output moved on identical inputs: its module. A module's input moved after identical
    records: the innermost enclosing module with recorded inputs, all compared and identical,
    whose own code between its recorded children made it (a scale applied to embeddings)."""
    start = first_moved(rec, every)
    if start is None:
        return None
    if start.record.kind != "input":
        return start.record.name, MovedOutput(relative_change(start), failing.record.id)
    for module in ancestors(start.record):
        found = [
            p
            for p in every.values()
            if p.record.name == module
            and p.record.kind == "input"
            and p.record.step == rec.step
            and p.record.phase == rec.phase
            and not set_aside(p)
        ]
        if not found:
            continue  # a container that never runs (a ModuleList): no evidence, go past it
        if any(not p.paired or moved(p) is not False for p in found):
            return None
        return module, MovedInput(start.record.id, relative_change(start), module, failing.record.id)
    return None


def unproven(evidence: InputEvidence) -> NoPartner:
    """Why no origin can be claimed: the first input without a partner."""
    return NoPartner(evidence.unmatched)


def within_tolerance(evidence: InputEvidence, output: PairResult) -> InputsWithinTolerance:
    """Inputs that passed but differed: the largest, and the output's own change."""
    dep, size = max(evidence.differed, key=lambda d: d[1])
    return InputsWithinTolerance(dep, size, relative_change(output))


def module_inputs_matched(module: str, kind: str, step: int, every: Mapping[str, PairResult]) -> bool | None:
    """Every ``kind`` record (input, or grad_output in backward) of ``module`` at ``step`` was
    compared and passed: True; some were not: False; none recorded (or all set aside): None.
    A mask, position or cache input whose form changed between the sides is set aside."""
    found = [
        p
        for p in every.values()
        if p.record.name == module and p.record.kind == kind and p.record.step == step and not set_aside(p)
    ]
    if not found:
        return None
    return all(p.passed for p in found)


def inputs_set_aside(module: str, step: int, every: Mapping[str, PairResult]) -> tuple[str, ...]:
    """The inputs of ``module`` at ``step`` set aside (``non_data_inputs``), by slot name."""
    names = (
        shown_slot(p.record)
        for p in every.values()
        if p.record.name == module and p.record.kind == "input" and p.record.step == step and set_aside(p)
    )
    return tuple(dict.fromkeys(names))


def steering_inputs_differed(module: str, step: int, every: Mapping[str, PairResult]) -> tuple[str, ...]:
    """The inputs of ``module`` at ``step`` that are not data (masks, positions, caches) and
    kept their form but failed: they differ in value, by slot name."""
    names = (
        shown_slot(p.record)
        for p in every.values()
        if p.record.name == module
        and p.record.kind == "input"
        and p.record.step == step
        and non_data(p.record)
        and not set_aside(p)
        and p.status in FAILED
    )
    return tuple(dict.fromkeys(names))


def matched_children(module: str, first: Record, pairs: Sequence[PairResult]) -> tuple[str, ...]:
    """The direct children of ``module`` whose outputs passed before ``first`` (same step and
    phase), by their names under ``module``."""
    if not module:
        return ()
    out = dict.fromkeys(
        p.record.name[len(module) + 1 :]
        for p in sorted(pairs, key=lambda p: p.record.seq)
        if p.passed
        and p.record.step == first.step
        and p.record.seq < first.seq
        and p.record.kind in ("activation", "grad_input")
        and p.record.name.rpartition(".")[0] == module
    )
    return tuple(out)
