"""Verdicts: per phase, is the candidate aligned, and where does it first diverge?

The first divergence is the first failing output record in execution order (forward:
activations, logits, loss; backward: grads in the order autograd produced them; step:
parameters after each optimizer step). It is the **origin** when the records it was
computed from matched (its inputs, or for a grad w.r.t. inputs, the grad w.r.t. outputs);
otherwise the divergence entered through code between modules, and ``origin_module``
names the enclosing module whose inputs still matched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ..compare.pairs import Check, Comparison, PairResult
from ..specs.coverage import DEFAULT_MIN_COVERAGE
from ..specs.expectation import Expectation
from ..trace.note_blocks import IncompleteStep, ReplicaMismatch
from ..trace.records import Record
from ..vocabulary import FAILED, GATE_KINDS, OPTIMIZER_UPDATE, STATS_EVIDENCE, Kind, Phase
from .coverage import Coverage, measure_coverage
from .divergence_start import comparable, deps_ok, divergent_pair
from .evidence import (
    input_evidence,
    inputs_set_aside,
    matched_children,
    module_inputs_matched,
    moved_origin,
    steering_inputs_differed,
    unproven,
    within_tolerance,
)
from .non_data_inputs import non_data, set_aside
from .origin_facts import (
    ApiCallEarlier,
    CaseOrigin,
    NoMatchedModule,
    OneSideBefore,
    OneSided,
    OriginProof,
    RecordChoice,
    SteeringInputs,
    UpdateCheck,
    WalkProof,
)
from .overflow import Overflow, overflow_levels
from .phase_checks import ExpectationChecked, NotGated, PhaseCheck


@dataclass(frozen=True)
class Divergence:
    name: str
    phase: Phase
    kind: Kind
    slot: str
    step: int
    call: int
    metric: str
    value: float
    allowed: float
    origin: bool
    origin_module: str
    evidence: str
    pair: PairResult
    proof: OriginProof | None = None  # what the origin claim rests on, when not simply "its inputs matched"
    proven: bool = True  # False: an input had no partner, so no origin could be established
    isolated: PairResult | None = None  # the module on the baseline's inputs (isolation mode)
    first_op: str | None = None  # the first diverging API call (mix-level dumps), "name#call"
    why: RecordChoice | None = None  # how the record was chosen, when it is not simply the first failing one
    # Inputs of the origin module not taken as evidence: masks, positions, caches whose form
    # changed between the sides (``non_data_inputs``), by slot name.
    inputs_aside: tuple[str, ...] = ()

    @property
    def rule(self) -> str:
        tol = self.pair.tolerance
        if tol is None or tol.rule is None:
            return tol.source if tol else "no tolerance"
        return tol.rule.describe()

    def as_dict(self, proof: str, why: str) -> dict[str, object]:
        """report.json's first divergence; ``proof`` and ``why``: the proof and how the record was
        chosen, in words (``reports.origin_text``)."""
        return {
            "name": self.name,
            "phase": self.phase,
            "kind": self.kind,
            "slot": self.slot,
            "step": self.step,
            "call": self.call,
            "metric": self.metric,
            "value": self.value,
            "allowed": self.allowed,
            "origin": self.origin,
            "origin_module": self.origin_module,
            "evidence": self.evidence,
            "rule": self.rule,
            "isolated_passed": self.isolated.passed if self.isolated is not None else None,
            "first_op": self.first_op,
            "why": why,
            "proof": proof,
            "proven": self.proven,
            "set_aside": list(self.inputs_aside),
        }


@dataclass(frozen=True)
class NonFinite:
    side: str
    record: Record


@dataclass(frozen=True)
class PartialStep:
    """A step a side's interrupted run left partial (``note``: which, and what is missing), not
    compared; ``compared``: the steps of that side that were."""

    note: IncompleteStep
    compared: tuple[int, ...]


@dataclass(frozen=True)
class PhaseVerdict:
    phase: Phase
    aligned: bool  # every paired record within tolerance, nothing failed
    compared: int
    failures: tuple[PairResult, ...]
    first: Divergence | None
    nonfinite: tuple[NonFinite, ...]
    only_baseline: tuple[Record, ...]
    only_candidate: tuple[Record, ...]
    worst: PairResult | None
    expectation: PhaseCheck | None  # None: no expectation; else what was checked against it
    passed: bool
    # Isolation mode: the first module (execution order) that diverges on the baseline's own
    # inputs -- the true origin -- and how many module outputs were isolated.
    isolated_origin: PairResult | None = None
    isolated_count: int = 0
    reasons: Mapping[str, str] = field(default_factory=dict)  # why unmatched records are one-sided
    overflow: tuple[Overflow, ...] = ()  # the candidate's NaN/Inf and norm blow-ups, by level
    # Every paired, gated record of the phase in execution order: what the HTML report charts.
    records: tuple[PairResult, ...] = ()
    # A merged multi-rank side whose TP ranks disagreed on a replicated record of this phase:
    # the merge's notes (the phase fails: a sharding rule is missing or one rank diverged).
    replica_mismatches: tuple[ReplicaMismatch, ...] = ()
    # A side's run interrupted mid-step: its partial steps, not compared (the phase fails).
    incomplete_steps: tuple[PartialStep, ...] = ()
    # The case's story (``story.tell_case``): where the case's divergence enters, whether this
    # phase only follows from it, and the origin module's children that matched before it.
    case_origin: CaseOrigin | None = None
    downstream: bool = False
    matched_children: tuple[str, ...] = ()
    # How much of the phase was paired at all; a problem with it fails the phase.
    coverage: Coverage | None = None

    @property
    def failed_count(self) -> int:
        return len(self.failures)


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _ancestors(rec: Record, parents: Mapping[str, str]) -> Iterator[str]:
    """Names of the modules enclosing a record, innermost first: from the trace's own tree
    (msprobe dumps carry one, keyed ``name#call``, where API records are not dotted paths),
    else from the dotted module path."""
    key = f"{rec.name}#{rec.call}"
    if key in parents:
        while key := parents.get(key, ""):
            yield key.partition("#")[0]
        return
    name = rec.name
    while name := _parent(name):
        yield name


def _check_of(pair: PairResult) -> Check:
    """The failing check; for a passing pair (a lower-precision record), its tightest one."""
    return pair.explaining_check or Check("dtype", 0.0, 0.0, True)


AMPLIFY = 10.0  # stats evidence: an origin's relative change must exceed its inputs' this much


def find_first(
    pairs: tuple[PairResult, ...],
    phase: Phase,
    all_pairs: Mapping[str, PairResult],
    parents: Mapping[str, str] | None = None,
    every: Mapping[str, PairResult] | None = None,
) -> Divergence | None:
    """``every``: each record id to its pair, one-sided ones too (default: ``all_pairs``)."""
    parents = parents or {}
    kinds = GATE_KINDS[phase]
    ordered = sorted(
        (p for p in pairs if p.record.kind in kinds and p.status in FAILED),
        key=lambda p: (p.record.step, p.record.seq),
    )
    if not ordered:
        return None
    # Layers first: in a mix-level dump (modules and APIs), an op inside a module fails before
    # the module returns; name the module, and keep the op as detail below it.
    modules = [
        p for p in ordered if p.record.module_class != "api" and p.record.kind not in ("logits", "loss")
    ]
    first_op = next((p.record for p in ordered if p.record.module_class == "api"), None)
    pair, why = divergent_pair(modules[0] if modules else ordered[0], pairs, all_pairs, kinds)
    rec = pair.record
    origin, origin_module, proof, proven, aside = _origin(pair, all_pairs, parents, every or all_pairs)
    name, call = rec.name, rec.call
    live_op = first_op is not None and parents.get(f"{first_op.name}#{first_op.call}", "") != ""
    if not modules and live_op:
        # Op-level trace (no module records): the layer is the module the op ran in; the op
        # is the detail, as in a mix-level dump.
        name, _, module_call = parents[f"{rec.name}#{rec.call}"].partition("#")
        call = int(module_call)
        origin_module = name if origin else origin_module
    elif first_op is not None and _diverged_outside(first_op, rec, parents):
        # An API call outside this module diverged earlier (inside a module whose own output
        # still passed): the divergence starts in that call's module.
        origin = False
        origin_module = next(_ancestors(first_op, parents), "") or first_op.name
        why = why or ApiCallEarlier(_op_label(first_op, parents))
    check = _check_of(pair)
    return Divergence(
        name=name,
        phase=phase,
        kind=rec.kind,
        slot=rec.slot,
        step=rec.step,
        call=call,
        metric=check.metric,
        value=check.value,
        allowed=check.allowed,
        origin=origin,
        origin_module=origin_module,
        evidence=pair.evidence,
        pair=pair,
        first_op=_op_label(first_op, parents) if first_op is not None else None,
        why=why,
        proof=proof,
        proven=proven,
        inputs_aside=aside,
    )


def _diverged_outside(first_op: Record, rec: Record, parents: Mapping[str, str]) -> bool:
    """An API call of the same step, before ``rec``, in a known module that is not one of
    ``rec``'s ancestors."""
    return (
        first_op.step == rec.step
        and first_op.seq < rec.seq
        and rec.module_class != "api"
        and f"{first_op.name}#{first_op.call}" in parents  # the call's module is known
        and rec.name not in _ancestors(first_op, parents)
    )


def _op_label(rec: Record, parents: Mapping[str, str]) -> str:
    """``Functional.softmax.0.forward in model.layers.0.self_attn`` for a live op record (n
    counts calls inside the module call), ``name#call`` for an msprobe dump's API record."""
    parent = parents.get(f"{rec.name}#{rec.call}", "")
    module, _, module_call = parent.partition("#")
    if not module or not rec.name.startswith(module + "."):
        return f"{rec.name}#{rec.call}"
    api = rec.name[len(module) + 1 :]
    direction = "forward" if rec.phase == "forward" else "backward"
    where = module + (f" (call {module_call})" if module_call not in ("", "0") else "")
    return f"{api}.{rec.call % 1000}.{direction} in {where}"


def _inputs_ok(
    module: str, rec: Record, every: Mapping[str, PairResult], data_only: bool = False
) -> bool | None:
    """``module``'s inputs at ``rec``'s step: all compared and within tolerance (True), one
    failed or a data input has no partner (False), none that can vouch was recorded (None).
    Masks, positions and caches whose form changed between the sides are set aside;
    ``data_only``: every such input is left out, whatever its form."""
    found = [
        p
        for p in every.values()
        if p.record.name == module
        and p.record.kind == "input"
        and p.record.step == rec.step
        and not set_aside(p)
        and not (data_only and non_data(p.record))
    ]
    if any(not p.paired for p in found):
        return False
    usable = [p for p in found if comparable(p)]
    if not usable:
        return None
    return all(p.passed for p in usable)


def _stats_change(pair: PairResult) -> float | None:
    """Relative change of max/min/norm between the sides (statistics evidence only)."""
    a, b = pair.record.stats, pair.candidate.stats if pair.candidate is not None else None
    if pair.evidence not in STATS_EVIDENCE or a is None or b is None:
        return None
    changes = [
        abs(vb - va) / abs(va)
        for va, vb in ((a.max, b.max), (a.min, b.min), (a.norm, b.norm))
        if va == va and vb == vb and abs(va) not in (0.0, float("inf")) and abs(vb) != float("inf")
    ]
    return max(changes, default=None)


def _amplified(pair: PairResult, all_pairs: Mapping[str, PairResult]) -> bool:
    """With statistics, inputs "within tolerance" may still differ (an absolute tolerance hides
    a change of small values): the record is an origin only if it changed clearly more, in
    relative terms, than its inputs did."""
    mine = _stats_change(pair)
    if mine is None:
        return True
    changes = [_stats_change(all_pairs[d]) for d in pair.record.deps if d in all_pairs]
    inputs = max((c for c in changes if c is not None), default=0.0)
    return inputs == 0.0 or mine > AMPLIFY * inputs


def _origin(
    pair: PairResult,
    all_pairs: Mapping[str, PairResult],
    parents: Mapping[str, str],
    every: Mapping[str, PairResult],
) -> tuple[bool, str, OriginProof | None, bool, tuple[str, ...]]:
    """(origin, origin module, what the claim rests on, proven, the module's inputs set aside)."""
    rec = pair.record
    enclosing = next(_ancestors(rec, parents), "")
    owner = enclosing if rec.kind in ("param", "param_grad") else rec.name
    failing = pair.failing
    if failing is not None and failing.metric == OPTIMIZER_UPDATE:
        # The step itself is wrong on its own inputs (its update check says so), whatever its grad did.
        return True, owner, UpdateCheck(pair.note) if pair.note else None, True, ()
    if rec.kind == "grad_output":
        # The grad w.r.t. a module's output is made by its consumers' backward, i.e. by
        # the parent's code between its children.
        return False, enclosing or ("" if rec.module_class == "api" else rec.name), None, True, ()
    inputs = input_evidence(rec, every)
    if inputs.unmatched and not inputs.failed:
        return (
            False,
            _matched_ancestor(rec, owner, parents, every),
            unproven(inputs),
            False,
            inputs.aside,
        )
    ok = deps_ok(rec, all_pairs)
    if ok and not _amplified(pair, all_pairs):
        ok = False
    if ok is None or ok:
        proof = within_tolerance(inputs, pair) if inputs.differed else None
        return True, owner, proof, True, inputs.aside
    if rec.kind in ("activation", "logits", "loss") and not inputs.failed and inputs.differed:
        # Its inputs passed but differed, and it did not amplify that: a difference under the
        # tolerance grew to this failure. Where the step was identical up to one module output
        # that differs at all on identical inputs, that module is where the sides part.
        start = moved_origin(rec, pair, every, lambda r: _ancestors(r, parents))
        if start is not None:
            return False, start[0], start[1], True, ()
    if rec.kind in ("activation", "logits", "loss"):
        # Inputs already differed: walk up to the innermost ancestor whose inputs were compared
        # and matched. A module with no input records (a ModuleList that never runs, inputs not
        # recorded) is no evidence: the walk goes past it, and names no origin without one.
        walked = False
        for module in _ancestors(rec, parents):
            walked = True
            if _inputs_ok(module, rec, every):
                return False, module, None, True, inputs_set_aside(module, rec.step, every)
            steering = steering_inputs_differed(module, rec.step, every)
            if steering and _inputs_ok(module, rec, every, data_only=True):
                # Its data matched and a mask or position of the same form did not: that input
                # is the evidence, and the divergence enters through it here.
                aside = inputs_set_aside(module, rec.step, every)
                return False, module, SteeringInputs(steering), True, aside
        return False, "", NoMatchedModule(walked=True) if walked else None, False, ()
    return False, owner, None, True, ()


def _matched_ancestor(
    rec: Record, owner: str, parents: Mapping[str, str], every: Mapping[str, PairResult]
) -> str:
    """The innermost module around ``rec`` (``owner`` first, unless ``rec`` is its output) whose
    inputs (grads w.r.t. its outputs, in backward) were all compared and within tolerance."""
    kind = {"forward": "input", "backward": "grad_output"}.get(rec.phase)
    if kind is None:
        return owner
    names = ([owner] if owner != rec.name else []) + list(_ancestors(rec, parents))
    names = list(dict.fromkeys(n for n in names if n))
    return next((n for n in names if module_inputs_matched(n, kind, rec.step, every)), "")


def phase_verdict(
    comparison: Comparison,
    phase: Phase,
    expectation: Expectation | None,
    expected_earlier: bool,
    isolated: Comparison | None = None,
    parents: Mapping[str, str] | None = None,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> PhaseVerdict:
    """``expected_earlier``: an expected divergence sits in an earlier phase of the case, so
    this phase is downstream of it and is reported but not gated."""
    pairs = comparison.by_phase(phase)
    all_pairs = {p.record.id: p for p in comparison.pairs if p.paired}
    # Module inputs are evidence for the origin, not gates: a mask may legitimately have
    # another representation on each side, and a real difference shows in the outputs.
    failures = tuple(p for p in pairs if p.status in FAILED and p.record.kind != "input")
    every = {p.record.id: p for p in comparison.pairs if p.status != "only_candidate"}
    first = find_first(pairs, phase, all_pairs, parents, every)
    if first is not None and not first.origin and not first.origin_module:
        first = _after_unmatched(first, pairs)
    isolated_origin, isolated_count = None, 0
    if isolated is not None and phase == "forward":
        first, isolated_origin, isolated_count = _with_isolation(first, isolated)
    nonfinite = _first_nonfinite(pairs)
    overflow = _candidate_overflow(pairs) if phase == "forward" else ()
    paired = [p for p in pairs if p.paired]
    # The worst record shown is a gated one: module inputs are evidence, not checks.
    worst = max((p for p in paired if p.record.kind != "input"), key=lambda p: p.severity, default=None)
    aligned = not failures
    passed, checked = _gate(aligned, phase, first, expectation, expected_earlier)
    verdict = PhaseVerdict(
        phase=phase,
        aligned=aligned,
        compared=len(paired),
        failures=failures,
        first=first,
        nonfinite=nonfinite,
        only_baseline=tuple(
            p.record for p in pairs if p.status == "only_baseline" and p.record.kind != "input"
        ),
        only_candidate=tuple(
            p.record for p in pairs if p.status == "only_candidate" and p.record.kind != "input"
        ),
        worst=worst,
        expectation=checked,
        passed=passed,
        isolated_origin=isolated_origin,
        isolated_count=isolated_count,
        reasons={p.record.id: p.note for p in pairs if p.status.startswith("only_") and p.note},
        overflow=overflow,
        records=tuple(
            sorted(
                (p for p in paired if p.record.kind != "input"), key=lambda p: (p.record.step, p.record.seq)
            )
        ),
        matched_children=matched_children(first.origin_module, first.pair.record, pairs) if first else (),
    )
    return with_coverage(verdict, pairs, min_coverage)


def with_coverage(verdict: PhaseVerdict, pairs: Sequence[PairResult], floor: float) -> PhaseVerdict:
    """The verdict with its phase's coverage: nothing compared, or less than ``floor`` of the
    baseline's output records paired, fails the phase whatever else it found."""
    coverage = measure_coverage(pairs, verdict.phase, floor)
    return replace(verdict, coverage=coverage, passed=verdict.passed and coverage.ok)


def _gate(
    aligned: bool, phase: Phase, first: Divergence | None, expectation: Expectation | None, earlier: bool
) -> tuple[bool, PhaseCheck | None]:
    """Passed, and what was checked instead of alignment: an ``expect:`` in this phase, or
    this phase being downstream of one in an earlier phase (reported, not gated)."""
    if expectation is not None and expectation.of_run:
        return True, NotGated("by_run", phase)
    if expectation is not None and expectation.phase == phase:
        return _meets(expectation, first)
    if earlier:
        return True, NotGated("downstream", phase)
    return aligned, None


def _with_isolation(
    first: Divergence | None, isolated: Comparison
) -> tuple[Divergence | None, PairResult | None, int]:
    """The isolation run (each candidate module on the baseline's inputs): the first divergence
    is an origin exactly when its module still diverges there; the first module that does, and
    how many were checked."""
    paired_iso = [p for p in isolated.pairs if p.paired]
    failing = sorted((p for p in paired_iso if not p.passed), key=lambda p: p.record.seq)
    if first is not None:
        mine = next((p for p in paired_iso if p.record.id == first.pair.record.id), None)
        if mine is not None:
            # On identical inputs the module either still diverges (its own error) or not.
            first = replace(first, isolated=mine, origin=not mine.passed)
    return first, failing[0] if failing else None, len(paired_iso)


def _candidate_overflow(pairs: tuple[PairResult, ...]) -> tuple[Overflow, ...]:
    """The candidate's overflows, minus those the baseline has too."""
    candidates = tuple(p.candidate for p in pairs if p.candidate is not None)
    overflow = overflow_levels(candidates, {r.id: r for r in candidates})
    if overflow:
        # Where the baseline overflows the same way (e.g. an attention mask of finfo.min, whose
        # norm is inf), the candidate did nothing wrong.
        goldens = tuple(p.record for p in pairs if p.paired)
        same = {(o.record.id, o.level) for o in overflow_levels(goldens, {r.id: r for r in goldens})}
        overflow = tuple(o for o in overflow if (o.record.id, o.level) not in same)
    return overflow


def _after_unmatched(first: Divergence, pairs: tuple[PairResult, ...]) -> Divergence:
    """No enclosing module whose inputs matched (an L1 dump has no module tree): the origin is
    unproven. A call that only one side made just before it (e.g. gelu where the baseline called
    silu) is the likely entry, but it has no partner, so it is a hint in the proof, never the
    origin: that stays the first divergent paired record."""
    kinds = GATE_KINDS[first.phase]
    own = first.pair.candidate

    def last_before(status: str, seq: int) -> Record | None:
        found = [
            p.record
            for p in pairs
            if p.status == status
            and p.record.kind in kinds
            and p.record.step == first.step
            and p.record.seq < seq
        ]
        return max(found, key=lambda r: r.seq, default=None)

    direction: Literal["forward", "backward"] = "forward" if first.phase == "forward" else "backward"
    base = last_before("only_baseline", first.pair.record.seq)
    cand = last_before("only_candidate", own.seq) if own is not None else None
    made = (
        OneSided(base.name, base.call, direction, "baseline") if base else None,
        OneSided(cand.name, cand.call, direction, "candidate") if cand else None,
    )
    sides = tuple(s for s in made if s is not None)
    if not sides:
        return first
    prior = first.proof if isinstance(first.proof, WalkProof) else None  # the walk's, from ``find_first``
    return replace(first, proof=OneSideBefore(prior, sides), proven=False)


def _meets(expect: Expectation, first: Divergence | None) -> tuple[bool, ExpectationChecked]:
    if first is None:
        return False, ExpectationChecked(expect, False, None)
    ok = first.name == expect.first_divergence
    if expect.origin is not None:
        ok = ok and first.origin == expect.origin
    if expect.kind is not None:
        ok = ok and first.kind == expect.kind
    return ok, ExpectationChecked(expect, ok, (first.name, first.origin, first.kind))


def _first_nonfinite(pairs: tuple[PairResult, ...]) -> tuple[NonFinite, ...]:
    out = []
    for side in ("baseline", "candidate"):
        for p in sorted(pairs, key=lambda p: p.record.seq):
            rec = p.record if side == "baseline" else p.candidate
            if rec is None or rec.kind == "input":
                continue
            if side == "candidate" and p.status == "only_baseline":
                continue
            if rec.stats is not None and not rec.stats.finite:
                out.append(NonFinite(side, rec))
                break
    return tuple(out)
