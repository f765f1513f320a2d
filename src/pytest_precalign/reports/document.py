"""The machine-readable reports: a phase as a dict, report.json (and report.html beside it),
JUnit properties. The text messages live in ``text``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..compare.pairs import PairResult
from ..errors import ConfigError
from ..redaction import redacted
from ..verdict.phase import PhaseVerdict
from .compare_csv import CSV_FILE, compare_csv_text
from .coverage_text import coverage_problem_text
from .expectation_text import expectation_text
from .folder import check_report_folder, publish_report
from .html import render_html
from .origin_text import choice_text
from .overflow_text import overflow_why
from .phase_notes_text import partial_step_text
from .text import PhaseReport, verdict_label, worst_metric
from .training_evidence_text import case_origin_text, proof_text
from .training_json import training_dict


def junit_properties(verdict: PhaseVerdict) -> list[tuple[str, object]]:
    """``<property>`` s for the JUnit XML of one item (via ``item.user_properties``)."""
    props: list[tuple[str, object]] = [
        ("precalign_verdict", verdict_label(verdict)),
        ("precalign_passed", verdict.passed),
    ]
    first = verdict.first
    if first is not None:
        props += [
            ("precalign_first_divergence", first.name),
            ("precalign_origin", str(first.origin).lower()),
            ("precalign_origin_module", first.origin_module),
        ]
    if verdict.case_origin is not None:
        props.append(("precalign_case_origin", f"{verdict.case_origin.module} ({verdict.case_origin.phase})"))
    worst = worst_metric(verdict)
    if worst is not None:
        props.append(("precalign_worst_metric", worst))
    cov = verdict.coverage
    if cov is not None:
        props += [
            ("precalign_coverage", round(cov.ratio, 4)),
            ("precalign_min_coverage", cov.floor),
            ("precalign_unexplained_unmatched", cov.unexplained),
        ]
        if cov.problem is not None:
            props.append(("precalign_coverage_problem", coverage_problem_text(cov)))
    return props


ENVIRONMENT_KEYS = ("versions", "platform", "device", "dtype", "seed", "torch_threads")


def _environment(env: Mapping[str, Any]) -> dict[str, Any]:
    facts = {k: env[k] for k in ENVIRONMENT_KEYS if k in env}
    flags = env.get("determinism")
    if isinstance(flags, Mapping) and "requested" in flags:
        facts["deterministic"] = flags["requested"]
    return facts


def _record_dict(pair: PairResult, report: PhaseReport) -> dict[str, Any]:
    r, tol = pair.record, pair.tolerance
    data = {
        "seq": r.seq,
        "name": r.name,
        "kind": r.kind,
        "slot": r.slot,
        "step": r.step,
        "call": r.call,
        "status": pair.status,
        "evidence": pair.evidence,
        "severity": pair.severity,
        "atol": tol.atol if tol else None,
        "rtol": tol.rtol if tol else None,
        "checks": [
            {"metric": c.metric, "value": c.value, "allowed": c.allowed, "passed": c.passed, "upper": c.upper}
            for c in pair.checks
        ],
    }
    data.update(_sides_dict(pair, report))
    return data


def _sides_dict(pair: PairResult, report: PhaseReport) -> dict[str, Any]:
    """Summaries of both sides (never tensors), for the module tree and compare_result.csv:
    dtype, shape, statistics [max, min, mean, norm], the candidate's own name where the
    mapping renamed, the rule that set the tolerance, the enclosing module of an API call."""
    r, c = pair.record, pair.candidate
    data: dict[str, Any] = {"dtype": r.dtype, "shape": list(r.shape)}
    if c is not None:
        data["candidate_dtype"], data["candidate_shape"] = c.dtype, list(c.shape)
    own = report.candidate_names.get(r.name)
    if own is not None:
        data["candidate_name"] = own
    crcs = {
        side: rec.crc32 for side, rec in (("baseline", r), ("candidate", c)) if rec is not None and rec.crc32
    }
    if crcs:
        data["crc32"] = crcs
    stats = {side: st for side, rec in (("baseline", r), ("candidate", c)) if (st := _stats(rec))}
    if stats:
        data["stats"] = stats
    tol = pair.tolerance
    if tol is not None:
        data["rule"] = tol.rule.describe() if tol.rule is not None else tol.source
    parent = report.parents.get(f"{r.name}#{r.call}", "").rsplit("#", 1)[0]
    if parent and not r.name.startswith(parent + "."):
        data["parent"] = parent
    return data


def _stats(rec: Any) -> list[float] | None:
    st = getattr(rec, "stats", None)
    return None if st is None else [st.max, st.min, st.mean, st.norm]


def phase_dict(report: PhaseReport) -> dict[str, Any]:
    v = report.verdict
    return {
        "config": report.config,
        "name": report.case,
        "phase": report.phase,
        "passed": report.passed,
        "verdict": verdict_label(v) if report.passed == v.passed else "failed",
        "aligned": v.aligned,
        "baseline": report.baseline,
        "candidate": report.candidate,
        "table": report.table,
        "compared": v.compared,
        "failed": v.failed_count,
        "coverage": v.coverage.as_dict(coverage_problem_text(v.coverage)) if v.coverage is not None else None,
        "first_divergence": v.first.as_dict(proof_text(v.first.proof), choice_text(v.first.why))
        if v.first
        else None,
        # The case's story: where its divergence enters (the same object in each phase's
        # entry), and whether this phase only follows from it.
        "origin": v.case_origin.as_dict(case_origin_text(v.case_origin)) if v.case_origin else None,
        "downstream_of": (
            f"{v.case_origin.module or v.case_origin.record} ({v.case_origin.phase})"
            if v.downstream and v.case_origin
            else None
        ),
        "expectation": expectation_text(v.expectation) if v.expectation is not None else None,
        # A training run's verdict over its steps (the same object in each phase's entry).
        "training": training_dict(report.training) if report.training is not None else None,
        "isolation": (
            {
                "checked": v.isolated_count,
                "origin": v.isolated_origin.record.name if v.isolated_origin else None,
            }
            if v.isolated_count
            else None
        ),
        "worst": _worst_dict(v),
        "overflow": [
            {"name": o.record.name, "call": o.record.call, "level": o.level, "why": overflow_why(o)}
            for o in v.overflow
        ],
        "nonfinite": [
            {"side": nf.side, "name": nf.record.name, "kind": nf.record.kind, "step": nf.record.step}
            for nf in v.nonfinite
        ],
        "unmatched": {
            "baseline": _unmatched(v.only_baseline, v.reasons),
            "candidate": _unmatched(v.only_candidate, v.reasons),
        },
        "failures": [_failure_dict(p) for p in v.failures],
        "incomplete_steps": [partial_step_text(p) for p in v.incomplete_steps],
        "seconds": report.seconds,
        "weights": dict(report.weights) if report.weights is not None else None,
        "reproduce": report.reproduce,
        "environment": _environment(report.environment),
        "records": [_record_dict(p, report) for p in v.records],
    }


def _worst_dict(v: PhaseVerdict) -> dict[str, Any] | None:
    if v.worst is None:
        return None
    return {
        "name": v.worst.record.name,
        "kind": v.worst.record.kind,
        "severity": v.worst.severity,
        "checks": [c.__dict__ for c in v.worst.checks],
        "metric": worst_metric(v),
    }


def _failure_dict(p: PairResult) -> dict[str, Any]:
    failing = p.failing
    return {
        "name": p.record.name,
        "kind": p.record.kind,
        "slot": p.record.slot,
        "step": p.record.step,
        "metric": failing.metric if failing else None,
        "value": failing.value if failing else None,
        "allowed": failing.allowed if failing else None,
    }


def _unmatched(records: Sequence[Any], reasons: Mapping[str, str]) -> list[dict[str, Any]]:
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        key = (r.name, r.kind, r.slot)
        if key not in seen:
            reason = reasons.get(r.id, "")
            seen[key] = {
                "name": r.name,
                "kind": r.kind,
                "slot": r.slot,
                "reason": reason,
                "unexplained": not reason,
            }
    return [seen[k] for k in sorted(seen)]


def check_report_dir(
    directory: str | Path, option: str = "--report", holds: str = "report.json", *, write: bool = True
) -> Path:
    """A directory the tool is to write into (``holds`` says what goes there), checked before
    anything runs: every existing part of it a directory, the deepest existing one writable
    (unless ``write`` is False: a read-only baseline folder serves for comparing). A report
    folder (``holds`` report.json) must also be one that can be replaced whole."""
    folder = Path(directory)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(
            f"{option}: {folder}: {existing} is a file, not a directory ({holds} goes into a directory)"
        )
    if write and existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}: {folder}: cannot write there ({existing} is not writable)")
    if holds == "report.json":
        check_report_folder(folder, option)
    return folder


def report_document(cases: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
    """What report.json holds (and report.html and compare_result.csv show): strict JSON values
    only, no secret. JSON has no NaN or Infinity: they are written as strings ("nan", "inf",
    "-inf"). One round trip through the C encoder and decoder (the decoder turns the three
    constants into strings), then the one redaction rule over every text (the config's path,
    an error a model raised, a factory's arguments: docs/security.md), once for all writers."""
    data = {"tool": "pytest-precalign", **dict(meta), **_training(cases), "cases": list(cases)}
    text = json.dumps(data, default=_json_default, allow_nan=True)
    return redacted(json.loads(text, parse_constant=_STRICT.__getitem__))  # type: ignore[no-any-return]


def _training(cases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The top-level ``training`` object: the training verdict of the one case that has one
    (``precalign compare``, a suite of one training case); none when several cases do (each
    case entry carries its own)."""
    found = {str(c.get("name")): c["training"] for c in cases if c.get("training") is not None}
    return {"training": next(iter(found.values()))} if len(found) == 1 else {}


_STRICT = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}


def write_reports(
    directory: str | Path,
    cases: Sequence[Mapping[str, Any]],
    meta: Mapping[str, Any],
    option: str = "--report",
) -> Path:
    """``report.json``, ``report.html`` and ``compare_result.csv`` (the same document, rendered)
    as the whole of ``directory``, published as one set (``folder``); returns report.json's path."""
    folder = check_report_folder(directory, option)
    data = report_document(cases, meta)
    files = {
        "report.json": json.dumps(data, indent=1, allow_nan=False),
        "report.html": render_html(data),
        CSV_FILE: compare_csv_text(data),
    }
    return publish_report(folder, files, option) / "report.json"


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return list(value)
    return str(value)
