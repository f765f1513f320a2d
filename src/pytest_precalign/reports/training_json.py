"""A training run verdict's report.json block, made when the verdict is rendered: its facts
(steps, class, origin, lane, curves) and its evidence, findings, warnings, replay and what it
did not compare told in words (``training_evidence_text``, ``replay_text``,
``not_compared_text``)."""

from __future__ import annotations

from typing import Any

from ..verdict.replay_finding import ReplayFinding
from ..verdict.training_run import TrainingVerdict
from .envelope_text import envelope_text
from .not_compared_text import not_compared_text
from .replay_text import replay_evidence_text, replay_text
from .run_pattern_text import pattern_text
from .training_evidence_text import evidence_text, finding_text, warning_text
from .training_text import downstream_text, expected_text


def training_dict(v: TrainingVerdict) -> dict[str, Any]:
    """The run verdict's report.json block (keys and their order as report.json has them)."""
    first = v.first
    return {
        "steps_compared": v.steps_compared,
        "first_divergent_step": first.step if first else None,
        "first_divergent": first.what if first else None,
        "origin": first.origin if first else None,
        "evidence": evidence_text(first.evidence) if first else None,
        "pattern": pattern_text(first.pattern) if first else None,
        "downstream": downstream_text(v) or None,
        "lane": v.lane,
        "findings": [finding_text(f) for f in v.findings],
        "warnings": [warning_text(w) for w in v.warnings],
        "replay": _replay(v),
        "envelope": envelope_text(v.envelope) or None,
        "unsaid_settings": list(v.unsaid),
        "expectation": expected_text(v.expected) if v.expected is not None else None,
        "passed": v.passed,
        "not_compared": [not_compared_text(n) for n in v.not_compared],
        "one_side_only": dict(v.one_side_only),
        "curves": dict(v.curves),
    }


def _replay(v: TrainingVerdict) -> dict[str, Any] | None:
    """The replay's facts, its evidence and its story in words (None: no replay)."""
    replay = v.replay
    if replay is None:
        return None
    told = {"evidence": replay_evidence_text(replay)} if isinstance(replay, ReplayFinding) else {}
    return {**replay.as_dict(), **told, "story": replay_text(v)}
