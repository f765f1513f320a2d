"""A training run verdict's findings, warnings and evidence in words, made when the verdict is
rendered (the verdict holds the facts: ``verdict.run_findings``, ``verdict.run_evidence``):
one function per field, used by the terminal, report.json, the HTML and the JUnit messages."""

from __future__ import annotations

from ..verdict import run_evidence, run_findings
from ..verdict.model_output import OutputGrad
from ..verdict.origin_facts import CaseOrigin, OriginProof, OtherData
from ..verdict.training_contract import ContractDiff
from ..verdict.training_scalars import ScalarDiff
from .contract_evidence_text import contract_evidence_text
from .origin_text import aside_text, module_proof_text
from .scalar_evidence_text import scalar_evidence_text

# Evidence checked before step 0, and the check that needs it on both sides.
_BEFORE_TRAINING = {
    "initial_params": ("initial parameters", "the initial weights are not compared"),
    "plan": ("training plan", "the settings (contract) are not checked before step 0"),
}


def finding_text(fact: run_findings.RunFinding) -> str:
    """One thing the runs could not pair, in words."""
    match fact:
        case run_findings.StepsOneSided(side, steps):
            return f"steps {ranges(steps)} recorded by the {side} only: the runs' steps do not line up"
        case run_findings.ScalarOneSided(name, side, steps):
            return f"{name} recorded by the {side} only (steps {ranges(steps)}): nothing to compare it with"
        case run_findings.UpdateSkippedOneSide(side, step):
            return (
                f"the {side} skipped the update of step {step} (an overflow?), the other did not: "
                "the steps after it do not line up"
            )
        case run_findings.BrokenAlike():
            return _broken(fact)
        case run_findings.RecordedOneSide(what, side):
            words, skipped = _BEFORE_TRAINING[what]
            return f"{words} recorded by the {side} only: {skipped}"
        case run_findings.NotTrainingRun():
            return "the case is not a training run"
    assert isinstance(fact, run_findings.FrozenChanged)
    return _frozen(fact)


def warning_text(fact: run_findings.RunWarning) -> str:
    """One thing that passed only because the table opted in, or evidence a side lacks."""
    if isinstance(fact, run_findings.PlanMissing):
        return f"the {fact.side}'s recording has no training plan: {fact.why}"
    return _broken(fact)


def _broken(fact: run_findings.BrokenAlike) -> str:
    told = (
        f"{fact.name} is {fact.value:.6g} on both sides from step {fact.since} "
        f"({fact.steps} of {fact.common} step(s))"
    )
    if fact.accepted:
        return f"{told}: accepted by the table's equal_nan: true"
    return (
        f"{told}: NaN/Inf is not a value, two runs broken alike are not aligned "
        "(equal_nan: true on the table's rule for it accepts it, with a warning)"
    )


def _frozen(fact: run_findings.FrozenChanged) -> str:
    head = f"frozen parameter {fact.name} changed on the {fact.side}: after step {fact.step} it is not "
    if fact.before is not None:
        return head + f"what it was after step {fact.before}"
    return head + f"its initial value (norm {fact.initial_norm:.6g} before training, {fact.norm:.6g} after)"


def ranges(steps: tuple[int, ...]) -> str:
    """``0-3, 5``: steps as runs of consecutive steps."""
    parts: list[str] = []
    start = prev = steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(parts)


# What the first scalar that moved was, in words (``MovedBefore``).
_MOVED = {
    "loss": "the loss",
    "grad_norm": "the grad norm (before clipping)",
    "update_norm": "the norm of the update",
}
# Why a scalar the DP replicas disagree on may differ (``ReplicasDisagree``).
_REPLICA_HINTS = {
    "grad_norm": "; each rank took the norm of its own grads (a shard's norm is not the global norm)",
    "clip_coef": "; the ranks clipped by other coefficients",
}


def evidence_text(fact: run_evidence.RunEvidence) -> str:
    """Why the run verdict names its first divergent step, class and origin, in words."""
    match fact:
        case run_evidence.ScalarsDiffer(scalar, hint):
            return scalar_text(scalar) + ("; record layers to tell the forward from the loss" if hint else "")
        case run_evidence.MovedBefore():
            return (
                f"{_MOVED[fact.name]} moved: {fact.a!r} vs {fact.b!r} at step {fact.step} (not past a tolerance), "
                f"after {fact.step} step(s) whose loss, grad norm and update norm were bitwise equal; step "
                f"{fact.then_step} then diverged past a tolerance: {fact.then_what} ({fact.then_origin})"
            )
        case run_evidence.PlansDiffer(diff):
            return f"the sides' settings differ before training: {contract_text(diff)}"
        case run_evidence.InitialParamsDiffer(name, a, b, more):
            told = f" and {more} more parameter(s)" if more else ""
            return f"the initial parameters differ: {name} norm {a:.6g} vs {b:.6g}{told}"
        case run_evidence.MicroBatchesDiffer(step, base, cand):
            return f"every module ran {base} time(s) in step {step} on the baseline, {cand} on the candidate"
        case run_evidence.LayerDiffers(record, kind, origin):
            if not origin.proven or not origin.module:
                return f"first failing record {record} ({kind}); origin unproven: {case_origin_text(origin)}"
            return f"{case_origin_text(origin)} ({kind} of {record})"
    return _grads_text(fact)


def proof_text(proof: OriginProof | None) -> str:
    """What a phase's origin claim rests on, in words (``origin_text``; nothing for no claim);
    the data story's names the run verdict's evidence."""
    if proof is None:
        return ""
    if not isinstance(proof, OtherData):
        return module_proof_text(proof)
    where = f"downstream of step {proof.step}'s data: " if proof.downstream else ""
    return (
        f"origin unproven: {where}{evidence_text(proof.data)}; the step's inputs were other data "
        "(the run verdict says data)"
    )


def case_origin_text(origin: CaseOrigin) -> str:
    """The case origin's evidence in words, with its inputs set aside."""
    told = proof_text(origin.evidence)
    return f"{told}; {aside_text(origin.aside)}" if origin.aside else told


def _grads_text(fact: run_evidence.RunEvidence) -> str:
    match fact:
        case run_evidence.LossRecordDiffers(metric, value, allowed):
            detail = f" ({metric} {value:.3g} > {allowed:.3g})" if metric is not None else ""
            return f"the loss differs{detail} while every forward record before it matched"
        case run_evidence.LossGradDiffers():
            return (
                f"the loss matched ({fact.losses_matched} loss record(s) of the step), its grad w.r.t. "
                f"{fact.record}'s output, the first of the backward, did not ({fact.metric} {fact.value:.3g} > "
                f"{fact.allowed:.3g}) while every forward record matched: the loss code made it from "
                "matching outputs, so the loss differs in its gradient"
            )
        case run_evidence.OutputGradDiffers(found, losses):
            return _output_grad(found, losses)
        case run_evidence.GradsScaled(step, count, factor):
            return f"all {count} parameter grads of step {step} differ by the factor {factor:.6g}"
        case run_evidence.GradsOneSided(step, grads):
            return _one_sided_grads(step, grads)
        case run_evidence.GradsChanged(step, failed, compared):
            return (
                f"{failed} of the {compared} recorded parameter grads of step {step} "
                "differ, of several modules, while every activation grad of the backward matched"
            )
        case run_evidence.GradNormOverOtherGrads(scalar, compared):
            return (
                scalar_text(scalar).split(";")[0] + f", and all {compared} recorded parameter grads matched"
            )
        case run_evidence.UpdateDiffers(name):
            return f"{name}: its grad matched, the optimizer update made it differ"
        case run_evidence.RanksTold(evidence, notes):
            return "; ".join([evidence_text(evidence), *map(rank_note_text, notes)])
    assert isinstance(fact, run_evidence.ReplicasDisagree)
    return _replicas(fact)


def _output_grad(found: OutputGrad, losses: tuple[float, float]) -> str:
    first = found.first
    where = f"; recorded at {first.name}, which returns that tensor" if first.name != found.module else ""
    shown = [f"{a.name} {a.slot} ({a.side} only)" for a in found.aside[:4]]
    aside = f"; set aside: {', '.join(shown)}{', ...' if len(found.aside) > 4 else ''}" if shown else ""
    return (
        f"the grad arriving at {found.module}'s output (the model's output{where}) differs ({first.metric} "
        f"{first.value:.3g} > {first.allowed:.3g}) while every forward record ({found.compared} compared) "
        f"and the logged loss ({losses[0]:.6g} vs {losses[1]:.6g}) matched, and no loss record was made: "
        f"the loss computed after the model (outside its modules) differs{aside}"
    )


def _one_sided_grads(step: int, one_sided: tuple[tuple[str, str], ...]) -> str:
    names = [name for name, _ in one_sided]
    sides = [side for _, side in one_sided]
    held = " and ".join(f"{sides.count(s)} on the {s}" for s in sorted(set(sides)))
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (
        f"{len(names)} parameter(s) got a grad at step {step} on one side only ({held}): {shown}; "
        "the other side's backward gave them none"
    )


def _replicas(fact: run_evidence.ReplicasDisagree) -> str:
    m = fact.mismatch
    said = f"{', '.join(m.differ)} recorded other values than {m.kept} ({m.detail})"
    if fact.scalar is not None:
        hint = _REPLICA_HINTS.get(fact.scalar, "")
        return f"the DP replicas disagree on {fact.scalar} at step {m.step}: {said}{hint}"
    return f"the DP replicas disagree on {m.name} ({m.kind}) at step {m.step}: {said}"


def scalar_text(diff: ScalarDiff) -> str:
    """A step's scalar difference in words."""
    return scalar_evidence_text(diff.evidence)


def contract_text(diff: ContractDiff) -> str:
    """The first difference of the sides' plans in words."""
    return contract_evidence_text(diff.evidence)


TP_CANNOT = (
    "which TP rank's share of {origin} differs cannot be told against a run without the same "
    "tensor-parallel layout: its output is all-reduced before it is recorded, so every rank records "
    "the same sum (compare with a rerun of the same TP layout, whose ranks keep their partial sums)"
)
TP_CANNOT_GRAD = (
    "which TP rank's shard of {origin}'s grad differs cannot be told against a run without the same "
    "tensor-parallel layout: the grad is recorded as the full tensor its shards make up (compare with "
    "a rerun of the same TP layout, whose ranks keep their local grad shards)"
)
DP_STATS_ONLY = (
    "which DP rank's rows differ cannot be told from statistics against a run that split the "
    "batch otherwise (record in tensor mode, or compare with a rerun of the same DP job)"
)


def rank_note_text(note: run_evidence.RankNote) -> str:
    """What a parallel side's ranks say of the first divergence, in words."""
    if isinstance(note, run_evidence.TpShares):
        return _partial_sums(note)
    return _replica_rows(note)


def _partial_sums(fact: run_evidence.TpShares) -> str:
    origin = fact.origin
    if fact.differ is None:
        return (TP_CANNOT_GRAD if fact.grads else TP_CANNOT).format(origin=origin)
    what = (
        f"local shard of {origin}'s grad" if fact.grads else f"partial sum of {origin} before the all-reduce"
    )
    if not fact.differ:
        return (
            f"every TP rank's {what} matches the other side's (max, min, sum, norm within {fact.rtol:g} "
            "relative): "
            + ("the shards agree" if fact.grads else "the shares agree, their reduction differs")
        )
    return (
        f"TP {', '.join(fact.differ)}: its {what} differs from the other side's same rank's (max, min, sum "
        f"or norm beyond {fact.rtol:g} relative); the other ranks' match"
    )


def _replica_rows(fact: run_evidence.ReplicaRows) -> str:
    if not fact.ranks:
        return DP_STATS_ONLY
    side = fact.side
    other = "baseline" if side == "candidate" else "candidate"
    said = []
    for r in fact.ranks:
        span = (
            f"row {r.first} of the global batch"
            if r.rows == 1
            else f"rows {r.first}-{r.first + r.rows - 1} of the global batch"
        )
        if r.check is None:
            said.append(f"DP rank {r.rank} ({span}) within tolerance")
        else:
            metric, value, allowed = r.check
            said.append(f"DP rank {r.rank} ({span}) differs: {metric} {value:.3g} (allowed {allowed:.3g})")
    differ = [r.rank for r in fact.ranks if not r.passed]
    head = (
        f"the {side}'s DP rank(s) {', '.join(differ)} computed it differently"
        if differ
        else f"no DP rank of the {side} differs alone"
    )
    return f"{head} (each replica's rows against the {other}'s same rows: {'; '.join(said)})"
