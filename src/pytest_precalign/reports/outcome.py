"""What one test item (a case and a phase, or a case's search) came to, as data
(``ItemOutcome``): the plugin records it and raises its failure, the CLI prints it and picks
the exit code. ``phase_outcome`` makes one from a phase's report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .document import junit_properties, phase_dict, report_document
from .text import PhaseReport, failure_message, summary_line


@dataclass(frozen=True)
class ItemOutcome:
    """What one test item (a case and a phase, or a case's search) came to."""

    name: str  # "<case>[<phase>]"
    passed: bool
    message: str = ""  # the failure, as the item shows it ("" when passed)
    summary: str = ""  # the line of the terminal summary ("" for none)
    entry: Mapping[str, Any] | None = None  # the report.json entry, plain JSON values (None: none)
    properties: tuple[tuple[str, object], ...] = ()  # JUnit <property>s


def phase_outcome(report: PhaseReport, extra: Mapping[str, Any] | None = None) -> ItemOutcome:
    """A case's phase judged against a live (or dump, or offline) baseline; ``extra`` keys are
    added to its report entry."""
    data = {**phase_dict(report), **(extra or {})}
    return ItemOutcome(
        name=report.nodeid_name,
        passed=report.passed,
        message="" if report.passed else failure_message(report),
        summary=summary_line(report),
        entry=plain_entry(data),
        properties=tuple(junit_properties(report.verdict)),
    )


def plain_entry(data: Mapping[str, Any]) -> dict[str, Any]:
    """A report entry in plain JSON values (it rides on xdist's test reports)."""
    return report_document([data], {})["cases"][0]  # type: ignore[no-any-return]
