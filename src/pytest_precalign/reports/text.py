"""Reports: verdicts -> message lines. Never prints, never writes (``document.py`` builds
report.json's dicts and writes the report files)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ..compare.pairs import SHARED_NONFINITE, Check, PairResult
from ..compare.tolerances import BOUND_METRICS
from ..verdict.origin_facts import Matched
from ..verdict.phase import Divergence, PhaseVerdict
from ..verdict.training_run import TrainingVerdict, owning_phase
from ..vocabulary import OPTIMIZER_UPDATE
from .coverage_text import coverage_problem_text, coverage_text
from .expectation_text import expectation_text
from .not_compared_text import not_compared_text
from .origin_text import ROLE_TEXT, choice_text
from .overflow_text import overflow_why
from .phase_notes_text import partial_step_text, replica_mismatch_text
from .training_evidence_text import case_origin_text, proof_text
from .training_text import blames_layer, training_lines, training_summary

TABLE_ROWS = 20  # failing records listed in a message; the rest are counted
UNMATCHED_NAMES = 5


class JudgedRun(Protocol):
    """What a report needs of a finished case (``run.outcome.CaseRun``)."""

    @property
    def name(self) -> str: ...
    @property
    def verdicts(self) -> Mapping[Any, PhaseVerdict]: ...
    @property
    def table(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def environment(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class PhaseReport:
    """What one test item (a case and a phase) knows, ready to format. Build it with
    ``of_run``."""

    # Where the case is defined: the alignment config file of a configured case, the baseline
    # side of ``precalign compare``, the test's node id for ``align_runner``. Its last part
    # is named in failure messages; report.json calls it "config".
    defined_in: str
    case: str
    phase: str
    verdict: PhaseVerdict
    baseline: str
    candidate: str
    table: str
    reproduce: str
    seconds: float = 0.0
    environment: Mapping[str, Any] = field(default_factory=dict)  # the run's manifest facts
    # For the module tree and compare_result.csv: baseline name -> the candidate's own name
    # (where the mapping renamed), and "name#call" -> enclosing module "name#call".
    candidate_names: Mapping[str, str] = field(default_factory=dict)
    parents: Mapping[str, str] = field(default_factory=dict)
    weights: Mapping[str, Any] | None = None  # the weight sync's report (``SyncReport.as_dict``)
    training: TrainingVerdict | None = None  # a training run's verdict over its steps
    carries_training: bool = False  # this item is the one a failing training verdict fails

    @property
    def passed(self) -> bool:
        """The item's outcome: its phase passed, and the training verdict it carries (if any)."""
        failing_run = self.carries_training and self.training is not None and not self.training.passed
        return self.verdict.passed and not failing_run

    @property
    def nodeid_name(self) -> str:
        return f"{self.case}[{self.phase}]"

    @property
    def config(self) -> str:
        """report.json's name for ``defined_in``."""
        return self.defined_in

    @classmethod
    def of_run(
        cls,
        run: JudgedRun,
        phase: str,
        *,
        defined_in: str,
        baseline: str,
        candidate: str,
        reproduce: str,
        case: str | None = None,
        seconds: float | None = None,
        with_environment: bool = False,
    ) -> PhaseReport:
        """The report of ``run``'s ``phase``; ``case`` and ``seconds`` default to the run's."""
        sync = getattr(run, "sync", None)  # a live case's weight sync (CaseRun.sync)
        training = getattr(run, "training", None)  # a training run's verdict (CaseRun.training)
        return cls(
            defined_in=defined_in,
            case=run.name if case is None else case,
            phase=phase,
            verdict=run.verdicts[phase],
            baseline=baseline,
            candidate=candidate,
            table=run.table,
            reproduce=reproduce,
            seconds=run.seconds if seconds is None else seconds,
            environment=run.environment if with_environment else {},
            candidate_names=getattr(run, "candidate_names", None) or {},
            parents=getattr(getattr(run, "baseline", None), "manifest", {}).get("parents") or {},
            weights=sync.as_dict() if sync is not None else None,
            training=training,
            carries_training=training is not None
            and owning_phase(training, getattr(run, "phases", ())) == phase,
        )


def fmt_number(x: float, digits: int = 6) -> str:
    """A check's number in messages and reports: 0, else scientific (3 decimals) outside
    [1e-3, 1e4), else ``digits`` significant digits (the HTML report uses 4). NaN and inf print
    as Python does ("nan", "inf"); the HTML report draws its own symbols for them."""
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.3e}"
    return f"{x:.{digits}g}"


def exceeded(metric: str, value: float, allowed: float) -> str:
    """``metric value > allowed`` for an upper bound, ``<`` for a lower one (cosine)."""
    relation = ">" if BOUND_METRICS.get(metric, True) else "<"
    return f"{metric} {fmt_number(value)} {relation} {fmt_number(allowed)}"


def _where(pair: PairResult) -> str:
    r = pair.record
    parts: list[str] = [r.kind]
    if r.slot:
        parts.append(r.slot)
    parts.append(f"step {r.step}")
    if r.call:
        parts.append(f"call {r.call}")
    return ", ".join(parts)


def describe_check(check: Check, pair: PairResult) -> str:
    if check.metric == "allclose" and pair.closeness is not None:
        return (
            f"|candidate - baseline| = {fmt_number(check.value)} > {fmt_number(check.allowed)} allowed "
            f"(atol + rtol*|baseline|) at index {pair.closeness.worst_index}"
        )
    if check.metric == "shape":
        return pair.note
    if check.metric == OPTIMIZER_UPDATE:
        relation = "<=" if check.passed else ">"
        return (
            f"|after - recomputed| = {fmt_number(check.value)} {relation} {fmt_number(check.allowed)} allowed "
            "(the case's optimizer recomputing the step on the side's own parameter, grad and state)"
        )
    if check.metric == "nonfinite":
        return f"{int(check.value)} NaN/Inf element(s) differ between the sides"
    if check.metric == SHARED_NONFINITE:
        if check.passed:
            return f"{int(check.value)} NaN/Inf element(s) at the same places on both sides, accepted by equal_nan: true"
        return (
            f"{int(check.value)} NaN/Inf element(s) at the same places on both sides: NaN is not a value "
            "(as torch.testing.assert_close, equal_nan=False); set equal_nan: true on the rule to accept it"
        )
    if check.metric == "crc32":
        other = pair.candidate
        return f"CRC-32 {other.crc32 if other else '?'} (candidate) != {pair.record.crc32} (baseline)"
    if check.value != check.value and not check.passed:
        return f"{check.metric} is not comparable: no element is finite on both sides"
    if check.metric.startswith("stats.") and check.value == float("inf") and pair.candidate is not None:
        key = check.metric.removeprefix("stats.")
        mine, theirs = (getattr(r.stats, key, "?") for r in (pair.candidate, pair.record))
        return (
            f"{check.metric}: {mine} (candidate) vs {theirs} (baseline): the NaN/Inf differ between the sides"
        )
    relation = "<=" if check.upper else ">="
    return f"{check.metric} = {fmt_number(check.value)}, allowed {relation} {fmt_number(check.allowed)}"


def closeness_lines(pair: PairResult) -> list[str]:
    c = pair.closeness
    tol = pair.tolerance
    if c is None or tol is None:
        return []
    pct = 100.0 * c.mismatched / c.total if c.total else 0.0
    return [
        f"Mismatched elements: {c.mismatched} / {c.total} ({pct:.1f}%)",
        f"Greatest absolute difference: {fmt_number(c.greatest_abs)} at index {c.greatest_abs_index} "
        f"(up to {fmt_number(tol.atol)} allowed)",
        f"Greatest relative difference: {fmt_number(c.greatest_rel)} at index {c.greatest_rel_index} "
        f"(up to {fmt_number(tol.rtol)} allowed)",
    ]


def shown_name(first: Divergence) -> str:
    """API records as msprobe names them (``Functional.linear.0.forward``), modules by path."""
    rec = first.pair.record
    if rec.module_class != "api":
        return first.name
    return f"{first.name}.{first.call}.{'forward' if first.phase == 'forward' else 'backward'}"


def _entry(first: Divergence) -> str:
    if first.origin_module:
        return first.origin_module
    if first.pair.record.module_class == "api" and first.kind == "grad_output":
        return "the backward of the code that consumed its output (no recorded call)"
    if first.pair.record.module_class == "api":
        return (
            "its inputs, though no earlier recorded call failed (a parameter, data, unrecorded "
            "code, or a change within tolerance that grew here)"
        )
    return "the top level"


def _role(first: Divergence) -> str:
    if first.origin:
        return f"origin: {proof_text(first.proof or Matched('grad' if first.kind == 'param' else 'inputs'))}"
    if not first.proven and first.proof:
        inner = first.origin_module or "none recorded"
        return f"{proof_text(first.proof)}; {ROLE_TEXT['matched_inputs']}: {inner}"
    return f"propagated: its inputs already differed; the divergence enters in {_entry(first)}"


def origin_headline(verdict: PhaseVerdict) -> list[str]:
    """The case's story first: its origin (or, for a later phase, that it is downstream)."""
    origin = verdict.case_origin
    if origin is None or verdict.first is None:
        return []
    where = f"{origin.phase}, step {origin.step}"
    if verdict.downstream:
        return [
            f"Downstream of {origin.module or origin.record} ({where}): this phase follows from the case's origin"
        ]
    if not origin.proven:
        return [
            f"Origin unproven ({where}): {case_origin_text(origin).removeprefix('origin unproven: ')}; "
            f"{ROLE_TEXT[origin.role]}: {origin.module or 'none recorded'}"
        ]
    return [f"Origin: {origin.module} ({where}) — {case_origin_text(origin)}"]


def divergence_lines(first: Divergence, downstream: bool = False) -> list[str]:
    pair = first.pair
    head = f"First divergence: {shown_name(first)} ({_where(pair)}), {_role(first)}"
    if downstream:
        head = (
            f"First failing record: {shown_name(first)} ({_where(pair)}), downstream of {first.origin_module}"
        )
    lines = [
        head,
        f"  {first.metric}: {describe_check(pair.failing or Check(first.metric, first.value, first.allowed, False), pair)}",
        f"  tolerance: {first.rule}",
    ]
    if pair.evidence == "stats":
        lines.append("  evidence is statistical (max/min/mean/norm), not element-wise")
    elif pair.evidence == "merged_stats":
        lines.append(
            "  evidence is merged statistics (max/min/mean/norm of parts merged against a fused "
            "tensor), not element-wise: which part diverged is not known"
        )
    if first.why is not None:
        lines.append(f"  why this record: {choice_text(first.why)}")
    if first.first_op is not None:
        lines.append(f"  the first diverging API call is {first.first_op}")
    if pair.note and pair.note not in lines[1]:
        lines.append(f"  note: {pair.note}")
    lines.extend("  " + line for line in closeness_lines(pair))
    return lines


def table_lines(failures: Sequence[PairResult], steps: bool = False) -> list[str]:
    """The failing records, one row each; ``steps``: with a step column (a multi-step phase)."""
    if not failures:
        return []
    head = ("record (baseline name)", *(("step",) if steps else ()), "kind", "metric", "value", "allowed")
    rows: list[tuple[str, ...]] = [head]
    for pair in failures[:TABLE_ROWS]:
        check = pair.failing
        if check is None:
            continue
        relation = "" if check.upper else ">= "
        name = pair.record.name + (f" {pair.record.slot}" if pair.record.slot not in ("", "out") else "")
        step = (str(pair.record.step),) if steps else ()
        rows.append(
            (
                name,
                *step,
                pair.record.kind,
                check.metric,
                fmt_number(check.value),
                relation + fmt_number(check.allowed),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    out = ["  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    if len(failures) > TABLE_ROWS:
        out.append(f"  ... and {len(failures) - TABLE_ROWS} more")
    return out


def several_steps(verdict: PhaseVerdict) -> bool:
    """The phase holds records of more than one step."""
    return len({p.record.step for p in (*verdict.records, *verdict.failures)}) > 1


def _names(records: Iterable[Any]) -> list[str]:
    return sorted({f"{r.name}" + (f" {r.slot}" if r.slot not in ("", "out") else "") for r in records})


def _unmatched(records: Sequence[Any], side: str, label: str = "") -> str:
    """``N side-only (names)``: N counts records; over several steps, also how many per step
    (a name missing in each of 2 steps is 2 records, 1 per step)."""
    names = _names(records)
    shown = ", ".join(names[:UNMATCHED_NAMES])
    if len(names) > UNMATCHED_NAMES:
        shown += f", ... ({len(names)} names in all)"
    per_step: dict[int, int] = {}
    for r in records:
        per_step[r.step] = per_step.get(r.step, 0) + 1
    if len(per_step) > 1:
        counts = set(per_step.values())
        if len(counts) == 1:
            each = f"{counts.pop()} per step over {len(per_step)} steps"
        else:
            each = "per step: " + ", ".join(f"step {k}: {n}" for k, n in sorted(per_step.items()))
        return f"{len(records)} {side}-only records ({each}; {shown}{label})"
    return f"{len(records)} {side}-only ({shown}{label})"


def unmatched_lines(verdict: PhaseVerdict) -> list[str]:
    if not verdict.only_baseline and not verdict.only_candidate:
        return []
    parts = []
    for side, records in (("baseline", verdict.only_baseline), ("candidate", verdict.only_candidate)):
        if records:
            bare = [r for r in records if not verdict.reasons.get(r.id)]
            label = f", {len(bare)} unexplained: no mapping rule or reason says why" if bare else ""
            parts.append(_unmatched(records, side, label))
    return ["Unmatched records: " + "; ".join(parts)]


def coverage_problem_lines(verdict: PhaseVerdict) -> list[str]:
    """What fails the phase for want of evidence: nothing compared, or coverage under the floor."""
    cov = verdict.coverage
    if cov is None or cov.ok:
        return []
    head, _, rest = coverage_problem_text(cov).partition(": ")
    return [f"{head.capitalize()} in {cov.phase}: {rest}"]


def coverage_lines(verdict: PhaseVerdict) -> list[str]:
    """The phase's coverage, one line."""
    cov = verdict.coverage
    if cov is None:
        return []
    line = f"Coverage: {coverage_text(cov).removeprefix('coverage ')}"
    if cov.unexplained:
        line += f"; {cov.unexplained} unmatched record(s) unexplained"
    return [line]


def _summary_coverage(verdict: PhaseVerdict) -> str:
    """``; coverage 98%`` (and what is unexplained, what only merged statistics compared) for
    the summary line."""
    cov = verdict.coverage
    if cov is None:
        return ""
    text = f"; coverage {coverage_text(cov).removeprefix('coverage ').partition(' (')[0]}"
    notes = [f"{cov.unexplained} unexplained"] if cov.unexplained else []
    notes += [f"{cov.merged} by merged statistics"] if cov.merged else []
    return text + (f" ({', '.join(notes)})" if notes else "")


def overflow_lines(verdict: PhaseVerdict) -> list[str]:
    if not verdict.overflow:
        return []
    shown = verdict.overflow[:UNMATCHED_NAMES]
    lines = [f"Overflow in the candidate ({len(verdict.overflow)} module outputs):"]
    lines += [f"  {o.level:8s} {o.record.name} ({overflow_why(o)})" for o in shown]
    return lines


def nonfinite_lines(verdict: PhaseVerdict) -> list[str]:
    return [
        f"NaN/Inf first appears in the {nf.side} at {nf.record.name} ({nf.record.kind} {nf.record.slot}, "
        f"step {nf.record.step}): {nf.record.stats.nan if nf.record.stats else '?'} NaN, "
        f"{nf.record.stats.inf if nf.record.stats else '?'} Inf"
        for nf in verdict.nonfinite
    ]


def isolation_lines(verdict: PhaseVerdict) -> list[str]:
    if not verdict.isolated_count:
        return []
    head = f"Isolation ({verdict.isolated_count} module outputs recomputed on the baseline's inputs): "
    origin = verdict.isolated_origin
    if origin is None:
        return [head + "every module agrees on identical inputs; the divergence enters outside the modules"]
    check = origin.failing
    detail = f" ({exceeded(check.metric, check.value, check.allowed)})" if check is not None else ""
    lines = [head + f"true origin {origin.record.name}{detail}"]
    first = verdict.first
    if first is not None and first.isolated is not None and first.isolated.passed:
        lines.append(f"  {first.name} matches on the baseline's inputs: its error is inherited")
    return lines


def failure_message(report: PhaseReport) -> str:
    v = report.verdict
    training, layer = report.training, blames_layer(report.training)
    # A one-step run whose divergence is in a layer: the case's story (origin, downstream) says
    # it all; the run's story leads over several steps or for a training-loop difference.
    told = training is not None and not training.passed and (not layer or training.steps_compared > 1)
    lines: list[str] = training_lines(training) if told and training is not None else []
    if told and _not_trained(report):  # stopped before step 0 (run.contract_check): no record to tell of
        return "\n".join([*lines, "Nothing was trained or recorded", f"To reproduce: {report.reproduce}"])
    lines += (origin_headline(v) if not v.aligned and layer else []) + coverage_problem_lines(v)
    if v.expectation is not None and not v.passed:
        lines.append(f"Known divergence not reproduced: {expectation_text(v.expectation)}")
    if v.aligned:  # "aligned" only where something was compared: else the coverage line says it
        lines.append(f"{report.phase}: every compared record within tolerance ({v.compared} compared)")
    else:
        lines.append(
            f"Tensors are not close: {v.failed_count} of {v.compared} {report.phase} records of "
            f"candidate {report.candidate!r} exceed tolerance vs baseline {report.baseline!r} "
            f"({Path(report.defined_in).name}, table {report.table!r})"
        )
    lines.extend(coverage_lines(v))
    if v.first is not None and not layer and training is not None and training.first is not None:
        tf = training.first
        entry = f"step {tf.step}'s {tf.what} ({tf.origin})"
        lines.extend(divergence_lines(replace(v.first, origin_module=entry), downstream=True))
    elif v.first is not None:
        lines.extend(divergence_lines(v.first, v.downstream))
    lines.extend(isolation_lines(v))
    lines.extend(nonfinite_lines(v))
    lines.extend(overflow_lines(v))
    if v.failures:
        lines.append("Failing records (execution order):")
        lines.extend(table_lines(v.failures, several_steps(v)))
    if v.replica_mismatches:
        lines.append(
            "Ranks disagree on replicated tensors (the first rank's copy was compared; "
            "a sharding rule is missing or one rank diverged):"
        )
        lines.extend(f"  {replica_mismatch_text(m)}" for m in v.replica_mismatches[:TABLE_ROWS])
    if v.incomplete_steps:
        lines.append("Steps not compared (a run interrupted mid-step; the phase fails):")
        lines.extend(f"  {partial_step_text(p)}" for p in v.incomplete_steps)
    lines.extend(unmatched_lines(v))
    lines.extend(weights_lines(report.weights))
    lines.append(f"To reproduce: {report.reproduce}")
    return "\n".join(lines)


def weights_lines(weights: Mapping[str, Any] | None) -> list[str]:
    """What a non-strict weight sync left (``weights: {strict: false}``); nothing when all paired."""
    if not weights or not (weights["unsynced"] or weights["unused"]):
        return []
    lines = [f"weights: {weights['copied']} copied by name, {weights['transformed']} through transforms"]
    for key, what in (
        ("unsynced", "candidate parameters left as built"),
        ("unused", "baseline parameters not used"),
    ):
        names = weights[key]
        if names:
            more = f" ... ({len(names)} in all)" if len(names) > UNMATCHED_NAMES else ""
            lines.append(f"  {what}: {', '.join(names[:UNMATCHED_NAMES])}{more}")
    return lines


def _skipped_weights(weights: Mapping[str, Any] | None) -> str:
    """The summary's note of a non-strict weight sync that left parameters out ("" for none)."""
    if not weights:
        return ""
    parts = [
        f"{len(weights[key])} {what}"
        for key, what in (
            ("unused", "baseline parameters not used"),
            ("unsynced", "candidate parameters as built"),
        )
        if weights[key]
    ]
    return f"; weights: {', '.join(parts)}" if parts else ""


def _not_trained(report: PhaseReport) -> bool:
    run = report.training
    return (
        report.verdict.compared == 0 and run is not None and run.steps_compared == 0 and run.first is not None
    )


def _run_story(report: PhaseReport) -> str:
    """The training run's part of a summary line: its story when it failed or warned, and
    what one side lacked (not compared)."""
    run = report.training
    if run is None:
        return ""
    story = training_summary(run) if not report.passed or run.warnings else ""
    if run.not_compared and (report.carries_training or run.passed):
        story += "; not compared: " + "; ".join(map(not_compared_text, run.not_compared))
    return story


def summary_line(report: PhaseReport) -> str:
    v = report.verdict
    status = "PASSED" if report.passed else "FAILED"
    if v.first is not None:
        role = "origin" if v.first.origin else f"propagated, enters in {_entry(v.first)}"
        run = report.training
        if run is not None and run.first is not None and not blames_layer(run):
            role = f"downstream of step {run.first.step}'s {run.first.what} ({run.first.origin})"
        elif v.downstream and v.case_origin is not None:
            role = f"downstream of {v.case_origin.module or v.case_origin.record} ({v.case_origin.phase})"
        elif not v.first.proven:
            role = f"origin unproven, innermost matched module {v.first.origin_module or 'none'}"
        bound = exceeded(v.first.metric, v.first.value, v.first.allowed)
        detail = f"first divergence {shown_name(v.first)} ({v.first.kind}, {bound}, {role})"
        if v.isolated_count:
            iso = v.isolated_origin.record.name if v.isolated_origin else "none"
            detail += f"; isolation: true origin {iso}"
        if v.expectation is not None:
            detail += f"; {expectation_text(v.expectation)}"
    elif v.worst is not None and v.worst.failing is None and v.worst.checks:
        worst = v.worst
        check = worst.explaining_check
        assert check is not None  # worst.checks is not empty
        detail = f"aligned; tightest {worst.record.name} {worst.record.kind} at {worst.severity:.0%} of its bound ({check.metric})"
    elif v.compared == 0 and v.coverage is None and v.expectation is not None:  # judged by the run's scalars
        detail = expectation_text(v.expectation)
    else:
        detail = "aligned"
    accepted = sum(any(c.metric == SHARED_NONFINITE and c.passed for c in p.checks) for p in v.records)
    if accepted:
        detail += f"; warning: {accepted} record(s) NaN/Inf on both sides, accepted by equal_nan: true"
    if v.replica_mismatches:
        detail += f"; ranks disagree on {len(v.replica_mismatches)} replicated record(s)"
    if v.incomplete_steps:
        detail += f"; {partial_step_text(v.incomplete_steps[0])}" + (
            f" (and {len(v.incomplete_steps) - 1} more)" if len(v.incomplete_steps) > 1 else ""
        )
    detail += _skipped_weights(report.weights)
    unmatched = len(v.only_baseline) + len(v.only_candidate)
    extra = f", {unmatched} unmatched" if unmatched else ""
    if v.coverage is not None and not v.coverage.ok:  # "aligned" would say more than was seen
        problem = coverage_problem_text(v.coverage)
        detail = problem if v.first is None else f"{problem}; {detail}"
    story = _run_story(report)
    if _not_trained(report):  # the contract check stopped the case before step 0
        detail, story = "nothing trained" + (training_summary(report.training) if report.training else ""), ""
        detail += "; the expected divergence" if report.training and report.training.met else ""
    return (
        f"{status} {report.nodeid_name}: {v.compared} compared{extra}; {detail}{_summary_coverage(v)}{story}"
    )


def verdict_label(verdict: PhaseVerdict) -> str:
    """One word for dashboards: passed, failed, or expected divergence (a gated expectation met,
    or a phase downstream of it)."""
    if not verdict.passed:
        return "failed"
    if verdict.expectation is not None and not verdict.aligned:
        return "expected divergence"
    return "passed"


def worst_metric(verdict: PhaseVerdict) -> str | None:
    """``metric=value`` of the tightest check of the phase's worst record."""
    worst = verdict.worst
    check = worst.explaining_check if worst is not None else None
    return f"{check.metric}={fmt_number(check.value)}" if check is not None else None
