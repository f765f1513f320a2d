"""The per-layer evidence of a training run, step by step: for each optimizer step, the first
diverging record of its forward, its loss, its backward and its update (parameters after the
step), and the whole-model patterns a single record cannot show (every grad scaled by one
factor, every parameter off after its grad matched, every module called k times more).

Each step's records are judged on their own (``phase.find_first`` restricted to the step), so
step k's origin is named from step k's records and never from a later step's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..compare.pairs import Comparison, PairResult, broken_alike
from ..trace.records import Record, Trace
from ..trace.step_scalars import StepScalars
from ..vocabulary import FAILED, Phase
from .grads_one_sided import one_sided_grads
from .model_output import OutputGrad, output_grad
from .phase import Divergence, find_first

UNIFORM = 1e-3  # relative spread under which per-parameter grad-norm ratios are "one factor"


@dataclass(frozen=True)
class StepRecords:
    """What step ``step``'s records show (None / False: nothing of that kind diverged)."""

    step: int
    forward: Divergence | None = None  # a module output or the logits
    forwards_compared: int = 0  # forward records of the step paired (the loss's aside)
    loss: PairResult | None = None  # the loss record, when it fails and nothing before it did
    backward: Divergence | None = None
    update: Divergence | None = None  # a parameter after the step
    grad_factor: float | None = None  # every param grad's norm scaled by this one factor
    grads_compared: int = 0
    grads_failed: int = 0
    every_param: bool = False  # every parameter record of the step failed
    params_compared: int = 0
    calls: tuple[int, int] | None = None  # module calls per step (baseline, candidate) when they differ
    grads_changed: bool = False  # param grads of 2+ modules failed, every activation grad matched
    # The backward's first divergence when it is the grad w.r.t. the output of a module no
    # recorded module encloses (made by the loss code from that output) while the forward and
    # every loss record of the step matched: the loss's gradient differs, not (yet) its value.
    loss_grad: Divergence | None = None
    losses_matched: int = 0
    # The same without a loss record (the loss made outside the model, e.g. TRL 0.7's DPO): the
    # backward's first divergence is the grad w.r.t. the model's output while every forward
    # record of the step was paired and matched (``model_output``); the run verdict names the
    # loss only where the logged loss matched too.
    output_grad: OutputGrad | None = None
    # Parameter grads one side recorded and the other did not, no reason given: (name, the
    # side that has it). A grad missing on one side is a difference, never a pair skipped.
    grads_one_sided: tuple[tuple[str, str], ...] = ()

    @property
    def diverged(self) -> bool:
        return (
            any(x is not None for x in (self.forward, self.loss, self.backward, self.update))
            or bool(self.calls)
            or bool(self.grads_one_sided)
        )


def step_records(comparison: Comparison, parents: Mapping[str, str] | None = None) -> dict[int, StepRecords]:
    """Each step's record evidence, by step (only steps with records). A record that fails
    only for the same NaN/Inf on both sides is no difference between the runs: the run's NaN
    finding tells it (``training_scalars.nonfinite_on_both``), not a divergence."""
    comparison = replace(
        comparison,
        pairs=tuple(replace(p, status="ok") if broken_alike(p) else p for p in comparison.pairs),
    )
    all_pairs = {p.record.id: p for p in comparison.pairs if p.paired}
    every = {p.record.id: p for p in comparison.pairs if p.status != "only_candidate"}
    by_step: dict[int, list[PairResult]] = {}
    for pair in comparison.pairs:
        by_step.setdefault(pair.record.step, []).append(pair)
    out: dict[int, StepRecords] = {}
    for step, pairs in sorted(by_step.items()):

        def first(phase: Phase, of: Sequence[PairResult] = pairs) -> Divergence | None:
            chosen = tuple(p for p in of if p.record.phase == phase)
            return find_first(chosen, phase, all_pairs, parents, every)

        forward = first("forward", [p for p in pairs if p.record.kind != "loss"])
        loss = next((p for p in pairs if p.record.kind == "loss" and p.status in FAILED), None)
        grads = [p for p in pairs if p.record.kind == "param_grad" and p.paired]
        backward = first("backward")
        losses = [p for p in pairs if p.record.kind == "loss" and p.paired]
        loss_grad = (
            backward
            if forward is None and losses and all(p.passed for p in losses) and _made_by_the_loss(backward)
            else None
        )
        params = [p for p in pairs if p.record.kind == "param" and p.paired]
        out[step] = StepRecords(
            step=step,
            forward=forward,
            forwards_compared=sum(
                p.paired for p in pairs if p.record.phase == "forward" and p.record.kind != "loss"
            ),
            loss=loss if forward is None else None,
            backward=backward,
            update=first("step"),
            grad_factor=_one_factor(grads),
            grads_compared=len(grads),
            grads_failed=sum(p.status in FAILED for p in grads),
            every_param=len(params) > 1 and all(p.status in FAILED for p in params),
            params_compared=len(params),
            calls=_calls(pairs),
            grads_changed=_changed_after_backward(grads, pairs),
            loss_grad=loss_grad,
            losses_matched=len(losses) if loss_grad is not None else 0,
            output_grad=output_grad(backward, pairs, parents or {}) if not losses else None,
            grads_one_sided=one_sided_grads(pairs),
        )
    return out


def _made_by_the_loss(first: Divergence | None) -> bool:
    """``first`` is the grad w.r.t. the output of a module that no recorded module encloses
    (its origin walk found no enclosing module: ``phase._origin``): code outside the recorded
    model made it from that output, i.e. the loss."""
    return (
        first is not None
        and first.kind == "grad_output"
        and first.pair.record.module_class != "api"
        and first.origin_module == first.name
    )


def _changed_after_backward(grads: Sequence[PairResult], pairs: Sequence[PairResult]) -> bool:
    """Param grads of at least two modules failed while the backward's activation grads (at
    least one compared) all matched: no module's backward explains that (its own parameters'
    grads only), the grads changed between the backward and the optimizer."""
    owners = {p.record.name.rpartition(".")[0] for p in grads if p.status in FAILED}
    if len(owners) < 2:
        return False
    activation = [p for p in pairs if p.record.kind in ("grad_input", "grad_output") and p.paired]
    return bool(activation) and not any(p.status in FAILED for p in activation)


def _norm_ratio(pair: PairResult) -> float | None:
    a = pair.record.stats
    b = pair.candidate.stats if pair.candidate is not None else None
    if a is None or b is None or not (a.finite and b.finite) or a.norm == 0:
        return None
    return b.norm / a.norm


def _one_factor(grads: Sequence[PairResult]) -> float | None:
    """The factor every failing param grad's norm is scaled by, when all of them (at least 2)
    fail and their norm ratios agree to ``UNIFORM``; None otherwise."""
    if len(grads) < 2 or not all(p.status == "fail" for p in grads):
        return None
    ratios = [_norm_ratio(p) for p in grads]
    known = [r for r in ratios if r is not None]
    if len(known) != len(ratios) or min(known) <= 0:
        return None
    low, high = min(known), max(known)
    if high / low - 1 > UNIFORM or abs(low - 1) <= UNIFORM:
        return None
    return (low + high) / 2


def _calls(pairs: Sequence[PairResult]) -> tuple[int, int] | None:
    """Module calls in the step, per side, when every module was called a fixed number of
    times on each side and those numbers differ (micro-batches split otherwise)."""
    counts: dict[str, list[set[int]]] = {}
    for p in pairs:
        if p.record.kind != "activation" or p.record.module_class == "api":
            continue
        sides = counts.setdefault(p.record.name, [set(), set()])
        if p.status != "only_candidate":
            sides[0].add(p.record.call)
        cand = (
            p.candidate if p.candidate is not None else (p.record if p.status == "only_candidate" else None)
        )
        if cand is not None:
            sides[1].add(cand.call)
    per = {(len(b), len(c)) for b, c in counts.values()}
    if len(per) != 1:
        return None
    n_base, n_cand = per.pop()
    return (n_base, n_cand) if n_base != n_cand and n_base and n_cand else None


def losses_from_records(trace: Trace) -> dict[int, StepScalars]:
    """Per-step scalars from a trace that has none: the loss of each step, read from its loss
    record (call 0), so a run recorded before scalars existed still has a loss curve."""
    out: dict[int, StepScalars] = {}
    for rec in trace.records:
        if rec.kind == "loss" and rec.call == 0 and rec.stats is not None and rec.numel == 1:
            out.setdefault(rec.step, StepScalars(step=rec.step, loss=_value(rec)))
    return out


def _value(rec: Record) -> float:
    assert rec.stats is not None
    return rec.stats.mean
