"""The update check: each optimizer step judged on its inputs, the parameters after a step
against the case's optimizer recomputing the step on what that side's optimizer was given.

AdamW turns tiny differences of near-zero grads into large update differences (at its first
step the update of an element is ``g / (|g| + eps)``: two grads of 1e-9 and 3e-9, both well
within a grad tolerance, move the weight by 0.09 lr and 0.23 lr). No tolerance table holds
that on every CPU, and a looser one would hide a real optimizer bug. So a parameter after a
step is judged by its inputs:

* each side's step is **recomputed**: the case's optimizer (``torch.optim``'s own AdamW, Adam or
  SGD, built by ``trainers.loop_optimizer.make_optimizer`` on a copy of the parameter) is given that side's
  parameter before the step (the synced initial weights at step 0, the side's own parameter
  after step ``k - 1`` later), that side's recorded grad, and the state its recomputation carried
  from the earlier steps (``exp_avg``, ``exp_avg_sq``, the step counter; momentum buffers);
* the side's parameter after the step must equal its recomputed step to rounding:
  ``|after - recomputed| <= ULPS * eps(dtype) * (|before| + |recomputed - before|)`` per element. A
  side whose optimizer is not the configured one (another eps, betas, step counter, weight
  decay on other parameters) fails there, **whatever the table says**: check
  ``optimizer_update``, named as the origin at its first step;
* when both recomputed steps hold and every grad of the parameter up to that step was within
  tolerance, the parameters' difference is what those grads explain, and the pair passes even
  where it is beyond the table (its passing ``optimizer_update`` check comes first, and a note
  says so). A parameter whose grads differed beyond tolerance keeps the table's verdict: it
  follows from the backward divergence. Every parameter judged this way carries the check
  (after the table's checks when these decide), valued at the side nearer its bound.

Over a training run with an LR schedule or grad clipping, each side's step is recomputed with
the LR its update used and the factor its clipping scaled the grads by, from that side's own
per-step scalars (``run_settings``: ``lr``, one for every group, and ``clip_coef``); a side's
wrong schedule or clipping shows in those scalars (the run verdict's ``schedule`` and
``clipping``), its optimizer in the update check. Recomputing needs that (or a constant LR and no
clipping: ``recomputable``), full tensors on both sides (record mode ``tensor``), every step's
grads from step 0 on (before clipping, as the optimizer was given them), and the parameters
before step 0 (``snapshot`` of the baseline before it runs, the candidate's too when the
weights were synced into it). Where any of that is missing, a parameter keeps the table's
verdict from that step on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ..compare.pairs import Check, Comparison, PairResult
from ..config.specs import OptimizerSpec
from ..trace.records import Record, Trace, record_id
from ..trace.step_scalars import scalars_of
from ..vocabulary import OPTIMIZER_UPDATE
from .trainers.loop_optimizer import decays, make_optimizer

# The rounding an update may carry: elementwise float arithmetic of another but equivalent
# implementation (fused, foreach, sharded) differs by a few units in the last place of the
# parameter and of the update; 16 is generous for that and ~100x below what an eps of 1e-6
# instead of 1e-8 does to grads of 1e-4 (a change of 1e-2 lr).
ULPS = 16
METRIC = OPTIMIZER_UPDATE


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters as they are now (before any step), by their names."""
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@dataclass(frozen=True)
class Recomputed:
    """One side's parameter after a step against its recomputed step, at the element furthest past
    (or closest to) its rounding bound."""

    worst: float  # |after - recomputed| there
    allowed: float  # the bound there
    index: tuple[int, ...]
    passed: bool


class _Recompute:
    """One side's parameters stepped again, step after step, each by its own optimizer on a copy."""

    def __init__(self, spec: OptimizerSpec) -> None:
        self.spec = spec
        self._copies: dict[str, tuple[torch.nn.Parameter, torch.optim.Optimizer]] = {}

    def step(
        self, name: str, before: torch.Tensor, grad: torch.Tensor, applied: tuple[float, float] | None = None
    ) -> torch.Tensor:
        """The parameter after one step from ``before`` on ``grad``; ``applied``: the side's
        (LR, clip coefficient) of the step, when its run recorded them (else the spec's LR,
        no clipping)."""
        if name not in self._copies:
            copy = torch.nn.Parameter(before.clone())
            # The side's own groups: no weight decay where the spec exempts the parameter
            # (biases and norm weights by default), as ``trainers.loop_optimizer.param_groups`` builds them.
            wd = self.spec.weight_decay if decays(name, before, self.spec.no_decay) else 0.0
            self._copies[name] = copy, make_optimizer(self.spec, [{"params": [copy], "weight_decay": wd}])
        copy, optimizer = self._copies[name]
        with torch.no_grad():
            copy.copy_(before)
        copy.grad = grad.to(copy.dtype).clone()
        if applied is not None:
            optimizer.param_groups[0]["lr"] = applied[0]
            if applied[1] != 1.0:
                copy.grad.mul_(applied[1])
        optimizer.step()
        return copy.detach().clone()


def measure(after: torch.Tensor, recomputed: torch.Tensor, before: torch.Tensor) -> Recomputed:
    """``after`` against ``recomputed`` under the rounding bound of an update from ``before``."""
    eps = torch.finfo(recomputed.dtype).eps if recomputed.dtype.is_floating_point else 0.0
    a, r, b = (t.detach().double().reshape(after.shape) for t in (after, recomputed, before))
    diff = (a - r).abs()
    bound = ULPS * eps * (b.abs() + (r - b).abs()) + torch.finfo(torch.float64).tiny
    same_nonfinite = ~torch.isfinite(a) & ((a == r) | (torch.isnan(a) & torch.isnan(r)))
    diff = torch.where(same_nonfinite, torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    ratio = diff / bound
    flat = int(torch.argmax(ratio).item()) if ratio.numel() else 0
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(after.shape))) if after.dim() else ()
    worst = float(diff.reshape(-1)[flat]) if diff.numel() else 0.0
    allowed = float(bound.reshape(-1)[flat]) if bound.numel() else 0.0
    return Recomputed(worst, allowed, index, bool((diff <= bound).all()))


@dataclass
class _Sides:
    baseline: Trace
    candidate: Trace  # in the baseline's names
    initial: Mapping[str, Mapping[str, torch.Tensor]]  # side -> name -> parameter before step 0
    by_id: Mapping[str, Mapping[str, Record]]
    applied: Mapping[str, Mapping[int, tuple[float, float]]] | None = None  # side -> step -> (LR, clip coef)

    def tensor(self, side: str, rec: Record | None) -> torch.Tensor | None:
        if rec is None:
            return None
        found = (self.baseline if side == "baseline" else self.candidate).array(rec)
        if found is None:
            return None
        # Back to the recorded dtype: arrays come widened (bfloat16 as float32), and the
        # recomputed step must round as the side's own step did.
        dtype = getattr(torch, rec.dtype, None)
        tensor = torch.from_numpy(np.array(found, copy=True))
        return tensor.to(dtype) if isinstance(dtype, torch.dtype) else tensor

    def before(self, side: str, name: str, step: int) -> torch.Tensor | None:
        if step == 0:
            return self.initial.get(side, {}).get(name)
        return self.tensor(side, self.by_id[side].get(record_id(name, "param", "", step - 1, 0)))


def judge_updates(
    comparison: Comparison,
    baseline: Trace,
    candidate: Trace,
    spec: OptimizerSpec,
    initial: Mapping[str, Mapping[str, torch.Tensor]],
) -> Comparison:
    """``comparison`` with each parameter after a step judged on its inputs (module doc).
    ``initial``: each side's (``"baseline"``, ``"candidate"``) parameters before step 0, in
    the baseline's names; a side without them is not checked. A side that steps fp32 main
    copies of lower-precision parameters (megatron-core's ``Float16OptimizerWithFloat16Params``)
    is not checked either: its copies' updates are not yet reproduced to the bit, so the table
    judges them (docs/limitations.md)."""
    if any(_mixed_precision(trace) for trace in (baseline, candidate)):
        return comparison
    applied = None
    if not recomputable(spec):
        applied = run_settings(spec, baseline, candidate)
        if applied is None:
            return comparison
    sides = _Sides(
        baseline,
        candidate,
        initial,
        {"baseline": baseline.by_id(), "candidate": candidate.by_id()},
        applied,
    )
    pairs = list(comparison.pairs)
    grads = _last_grads(pairs)
    for name, steps in _param_pairs(pairs).items():
        # One parameter at a time: its copies and optimizer state are freed before the next.
        recomputes = {"baseline": _Recompute(spec), "candidate": _Recompute(spec)}
        grads_ok = True
        for position, (i, pair) in enumerate(steps):
            if pair.record.step != position:
                break  # a step missing: no state to carry on from
            grad = grads.get((name, position))
            if grad is None:
                break
            grads_ok = grads_ok and grad.passed
            found = _recompute_both(sides, recomputes, pair, grad)
            if found is None:
                break
            pairs[i] = judged(pair, found, grads_ok, spec)
    return replace(comparison, pairs=tuple(pairs))


def _mixed_precision(trace: Trace) -> bool:
    settings = trace.run.settings
    recorded = settings.arguments.get("recorded_params") if settings is not None else None
    return isinstance(recorded, str) and recorded.startswith("main_param")


def recomputable(spec: OptimizerSpec) -> bool:
    """The recomputation models a constant LR and the recorded grads as the optimizer's without the
    run's scalars: an LR schedule or grad clipping (which scale the update by the step's LR or
    global grad norm) need each step's LR and clip coefficient (``run_settings``)."""
    return spec.schedule is None and spec.clip_grad is None


def run_settings(
    spec: OptimizerSpec, baseline: Trace, candidate: Trace
) -> dict[str, dict[int, tuple[float, float]]] | None:
    """Each side's (LR, clip coefficient) at each step, from its run's per-step scalars: the
    LR its update used (one for every group) and the factor its clipping scaled the grads by
    (``_clip_factor``; 1 when ``spec`` does not clip). A step without them ends that side's settings there (the
    recomputation stops at it); None when neither side has any."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for side, trace in (("baseline", baseline), ("candidate", candidate)):
        settings: dict[int, tuple[float, float]] = {}
        scalars = scalars_of(trace.manifest, f"the {side}'s trace")
        for step in sorted(scalars):
            s = scalars[step]
            coef = 1.0 if spec.clip_grad is None else _clip_factor(spec.clip_grad, s.grad_norm, s.clip_coef)
            if step != len(settings) or not s.lr or len(set(s.lr)) != 1 or coef is None or s.skipped:
                break
            settings[step] = (float(s.lr[0]), float(coef))
        out[side] = settings
    return out if any(out.values()) else None


def _clip_factor(clip_grad: float, norm: float | None, measured: float | None) -> float | None:
    """The factor a side's clipping scaled the grads by, as its framework computed it from the
    grad norm it measured: ``max_norm / (norm + 1e-6)`` at most 1, in float32 tensors where the
    norm is a float32 value (torch's ``clip_grad_norm_``), else in Python floats (megatron-core's
    ``clip_grad_by_total_norm_fp32``). The grads must be scaled bitwise as the side did: AdamW's
    moments of sign-changing grads cancel, and amplify a last-bit difference of the factor. The
    measured coefficient (the norms' ratio after and before) must confirm it to 1e-4; the
    measured one where the side clips otherwise."""
    if norm is None or measured is None:
        return None
    if float(np.float32(norm)) == norm:
        factor = float((clip_grad / (torch.tensor(norm, dtype=torch.float32) + 1e-6)).clamp(max=1.0))
    else:
        factor = min(1.0, clip_grad / (norm + 1e-6))
    return factor if abs(factor - measured) <= 1e-4 * factor else measured


def _last_grads(pairs: Sequence[PairResult]) -> dict[tuple[str, int], PairResult]:
    """Each parameter's grad pair per step: the last call (the grad the optimizer saw)."""
    out: dict[tuple[str, int], PairResult] = {}
    for p in pairs:
        if p.record.kind == "param_grad" and p.paired:
            key = (p.record.name, p.record.step)
            if key not in out or out[key].record.call < p.record.call:
                out[key] = p
    return out


def _param_pairs(pairs: Sequence[PairResult]) -> dict[str, list[tuple[int, PairResult]]]:
    out: dict[str, list[tuple[int, PairResult]]] = {}
    for i, p in enumerate(pairs):
        if p.record.kind == "param" and p.paired and p.status != "shape" and p.evidence == "tensor":
            out.setdefault(p.record.name, []).append((i, p))
    return {name: sorted(found, key=lambda t: t[1].record.step) for name, found in out.items()}


def _recompute_both(
    sides: _Sides, recomputes: Mapping[str, _Recompute], pair: PairResult, grad: PairResult
) -> dict[str, Recomputed] | None:
    """Each side's parameter after the step against its recomputed step; None when an input is missing."""
    name, step = pair.record.name, pair.record.step
    found: dict[str, Recomputed] = {}
    for side, after_rec, grad_rec in (
        ("baseline", pair.record, grad.record),
        ("candidate", pair.candidate, grad.candidate),
    ):
        before, g = sides.before(side, name, step), sides.tensor(side, grad_rec)
        after = sides.tensor(side, after_rec)
        if before is None or g is None or after is None or not (before.shape == g.shape == after.shape):
            return None
        applied = None if sides.applied is None else sides.applied[side].get(step)
        if sides.applied is not None and applied is None:
            return None  # the side's LR or clip coefficient of the step is unknown
        found[side] = measure(after, recomputes[side].step(name, before, g, applied), before)
    return found


def judged(
    pair: PairResult, found: Mapping[str, Recomputed], grads_ok: bool, spec: OptimizerSpec
) -> PairResult:
    """The pair judged on its recomputed steps: failed at the optimizer update when a side's
    step is not its recomputed one; passed when both are and its grads matched; else the table's verdict."""
    wrong = next((side for side in ("candidate", "baseline") if not found[side].passed), None)
    if wrong is not None:
        r = found[wrong]
        check = Check(METRIC, r.worst, r.allowed, False)
        note = (
            f"the {wrong}'s optimizer step is not {describe(spec)} on its own inputs: "
            f"|{wrong} - recomputed| = {r.worst:.3e} > {r.allowed:.3e} allowed ({ULPS} ulps of the "
            f"parameter and its update) at index {r.index}; the recomputed step is torch.optim's "
            f"{spec.name} run on the {wrong}'s parameter before the step, its grad and its state"
        )
        return replace(pair, status="fail", checks=(check, *pair.checks), note=note)
    mine = max(found.values(), key=lambda r: r.worst / r.allowed)  # the side nearer its bound
    check = Check(METRIC, mine.worst, mine.allowed, True)
    if pair.passed or not grads_ok:
        # Within the table, or beyond it after grads that were not: the table's verdict, with
        # the update check as evidence.
        return replace(pair, checks=(*pair.checks, check))
    table = pair.failing
    beyond = f"{table.metric} {table.value:.3e} > {table.allowed:.3e}" if table is not None else "the table"
    note = (
        f"beyond the table ({beyond}) only as its grads' differences, all within tolerance, "
        f"explain: both sides' updates are {describe(spec)} on their own inputs (within "
        f"{mine.worst:.3e} of their recomputed steps, {ULPS} ulps allowed)"
    )
    kept = tuple(c for c in pair.checks if c.passed)
    return replace(pair, status="ok", checks=(check, *kept), note=note)


def describe(spec: OptimizerSpec) -> str:
    """``adamw(lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01)``."""
    if spec.name == "sgd":
        return f"sgd(lr={spec.lr}, momentum={spec.momentum}, weight_decay={spec.weight_decay})"
    return f"{spec.name}(lr={spec.lr}, betas={tuple(spec.betas)}, eps={spec.eps}, weight_decay={spec.weight_decay})"


def update_judge(spec: OptimizerSpec, initial: Mapping[str, Mapping[str, torch.Tensor]]) -> Any:
    """``FinishInputs.judge_steps`` for a case run with ``spec``: ``judge_updates`` bound."""

    def judge(comparison: Comparison, baseline: Trace, candidate: Trace) -> Comparison:
        return judge_updates(comparison, baseline, candidate, spec, initial)

    return judge
