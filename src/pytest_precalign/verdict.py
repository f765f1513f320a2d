"""Verdicts: per phase, is the candidate aligned, and where does it first diverge?

The first divergence is the first failing output record in execution order (forward:
activations, logits, loss; backward: grads in the order autograd produced them; step:
parameters after each optimizer step). It is the **origin** when the records it was
computed from matched (its inputs, or for a grad w.r.t. inputs, the grad w.r.t. outputs);
otherwise the divergence entered through code between modules, and ``origin_module``
names the enclosing module whose inputs still matched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from .compare import Check, Comparison, PairResult
from .config import Expectation
from .overflow import Overflow, overflow_levels
from .trace import Record

OUTPUT_KINDS = {
    "forward": ("activation", "logits", "loss"),
    "backward": ("grad_output", "grad_input", "param_grad"),
    "step": ("param",),
}


@dataclass(frozen=True)
class Divergence:
    name: str
    phase: str
    kind: str
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
    isolated: PairResult | None = None  # the module on the baseline's inputs (isolation mode)
    first_op: str | None = None  # the first diverging API call (mix-level dumps), "name#call"

    @property
    def rule(self) -> str:
        tol = self.pair.tolerance
        if tol is None or tol.rule is None:
            return tol.source if tol else "no tolerance"
        return tol.rule.describe()

    def as_dict(self) -> dict[str, object]:
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
        }


@dataclass(frozen=True)
class NonFinite:
    side: str
    record: Record


@dataclass(frozen=True)
class PhaseVerdict:
    phase: str
    aligned: bool  # every paired record within tolerance, nothing failed
    compared: int
    failures: tuple[PairResult, ...]
    first: Divergence | None
    nonfinite: tuple[NonFinite, ...]
    only_baseline: tuple[Record, ...]
    only_candidate: tuple[Record, ...]
    worst: PairResult | None
    expectation: str | None  # None: no expectation; else what was checked against it
    passed: bool
    # Isolation mode: the first module (execution order) that diverges on the baseline's own
    # inputs -- the true origin -- and how many module outputs were isolated.
    isolated_origin: PairResult | None = None
    isolated_count: int = 0
    reasons: Mapping[str, str] = field(default_factory=dict)  # why unmatched records are one-sided
    overflow: tuple[Overflow, ...] = ()  # the candidate's NaN/Inf and norm blow-ups, by level

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
    check = pair.failing
    assert check is not None
    return check


def find_first(
    pairs: tuple[PairResult, ...],
    phase: str,
    all_pairs: Mapping[str, PairResult],
    parents: Mapping[str, str] | None = None,
) -> Divergence | None:
    kinds = OUTPUT_KINDS[phase]
    ordered = sorted(
        (p for p in pairs if p.record.kind in kinds and p.status in ("fail", "shape")),
        key=lambda p: (p.record.step, p.record.seq),
    )
    if not ordered:
        return None
    # Layers first: in a mix-level dump (modules and APIs), an op inside a module fails before
    # the module returns; name the module, and keep the op as detail below it.
    modules = [
        p for p in ordered if p.record.module_class != "api" and p.record.kind not in ("logits", "loss")
    ]
    pair = modules[0] if modules else ordered[0]
    first_op = next((p.record for p in ordered if p.record.module_class == "api"), None)
    rec = pair.record
    parents = parents or {}
    origin, origin_module = _origin(rec, all_pairs, parents)
    name, call = rec.name, rec.call
    live_op = first_op is not None and parents.get(f"{first_op.name}#{first_op.call}", "") != ""
    if not modules and live_op:
        # Op-level trace (no module records): the layer is the module the op ran in; the op
        # is the detail, as in a mix-level dump.
        name, _, module_call = parents[f"{rec.name}#{rec.call}"].partition("#")
        call = int(module_call)
        origin_module = name if origin else origin_module
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


def _deps_ok(rec: Record, all_pairs: Mapping[str, PairResult]) -> bool | None:
    """True/False when every dependency was compared; None when some were not recorded."""
    results = [all_pairs.get(d) for d in rec.deps]
    known = [r for r in results if r is not None and _comparable(r)]
    if not known:
        return None
    return all(r.passed for r in known)


def _comparable(pair: PairResult) -> bool:
    """A dependency that can vouch for its consumer: same dtype, floating point."""
    other = pair.candidate
    return (
        pair.paired
        and other is not None
        and pair.record.dtype == other.dtype
        and pair.record.dtype.startswith(("float", "bfloat", "complex"))
    )


def _inputs_ok(module: str, rec: Record, all_pairs: Mapping[str, PairResult]) -> bool | None:
    found = [
        p
        for p in all_pairs.values()
        if p.record.name == module
        and p.record.kind == "input"
        and p.record.step == rec.step
        and _comparable(p)
    ]
    if not found:
        return None
    return all(p.passed for p in found)


def _origin(rec: Record, all_pairs: Mapping[str, PairResult], parents: Mapping[str, str]) -> tuple[bool, str]:
    enclosing = next(_ancestors(rec, parents), "")
    owner = enclosing if rec.kind in ("param", "param_grad") else rec.name
    if rec.kind == "grad_output":
        # The grad w.r.t. a module's output is made by its consumers' backward, i.e. by
        # the parent's code between its children.
        return False, enclosing or rec.name
    ok = _deps_ok(rec, all_pairs)
    if ok is None or ok:
        return True, owner
    if rec.kind in ("activation", "logits", "loss"):
        # Inputs already differed: walk up to the innermost ancestor whose inputs matched.
        module = ""
        for module in _ancestors(rec, parents):
            inputs = _inputs_ok(module, rec, all_pairs)
            if inputs is None or inputs:
                return False, module
        return False, module
    return False, owner


def phase_verdict(
    comparison: Comparison,
    phase: str,
    expectation: Expectation | None,
    expected_earlier: bool,
    isolated: Comparison | None = None,
    parents: Mapping[str, str] | None = None,
) -> PhaseVerdict:
    """``expected_earlier``: an expected divergence sits in an earlier phase of the case, so
    this phase is downstream of it and is reported but not gated."""
    pairs = comparison.by_phase(phase)
    all_pairs = {p.record.id: p for p in comparison.pairs if p.paired}
    # Module inputs are evidence for the origin, not gates: a mask may legitimately have
    # another representation on each side, and a real difference shows in the outputs.
    failures = tuple(p for p in pairs if p.status in ("fail", "shape") and p.record.kind != "input")
    first = find_first(pairs, phase, all_pairs, parents)
    isolated_origin = None
    isolated_count = 0
    if isolated is not None and phase == "forward":
        paired_iso = [p for p in isolated.pairs if p.paired]
        isolated_count = len(paired_iso)
        failing = sorted((p for p in paired_iso if not p.passed), key=lambda p: p.record.seq)
        isolated_origin = failing[0] if failing else None
        if first is not None:
            mine = next((p for p in paired_iso if p.record.id == first.pair.record.id), None)
            if mine is not None:
                # On identical inputs the module either still diverges (its own error) or not.
                first = replace(first, isolated=mine, origin=not mine.passed)
    nonfinite = _first_nonfinite(pairs)
    candidates = tuple(p.candidate for p in pairs if p.candidate is not None)
    overflow = overflow_levels(candidates, {r.id: r for r in candidates}) if phase == "forward" else ()
    paired = [p for p in pairs if p.paired]
    worst = max(paired, key=lambda p: p.severity, default=None)
    aligned = not failures
    passed = aligned
    checked: str | None = None
    if expectation is not None and expectation.phase == phase:
        passed, checked = _meets(expectation, first)
    elif expected_earlier:
        passed, checked = True, "downstream of the expected divergence (not gated)"
    return PhaseVerdict(
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
    )


def _meets(expect: Expectation, first: Divergence | None) -> tuple[bool, str]:
    wanted = f"first divergence {expect.first_divergence!r}"
    if expect.origin is not None:
        wanted += f" (origin: {str(expect.origin).lower()})"
    if expect.kind is not None:
        wanted += f" of kind {expect.kind}"
    if first is None:
        return False, f"expected {wanted} ({expect.where}), but the phase is aligned"
    found = f"{first.name!r} (origin: {str(first.origin).lower()}, kind {first.kind})"
    ok = first.name == expect.first_divergence
    if expect.origin is not None:
        ok = ok and first.origin == expect.origin
    if expect.kind is not None:
        ok = ok and first.kind == expect.kind
    if ok:
        return True, f"found the expected {wanted}"
    return False, f"expected {wanted} ({expect.where}), found {found}"


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
