"""``--align-baseline`` for the plugin's test items: a case's check against its stored
baseline (``store.check_case``, run once per case by the plugin) turned into each phase item's
outcome, as data. No pytest, no session state: the plugin records the outcome and raises.

The policy (pytest-regressions'): a baseline written now fails; ``updated``
(``--align-update``, it mismatched) fails; ``rewritten`` (``--align-update-all``) passes;
``compared`` passes when the phase is aligned."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config.specs import CaseSpec
from ..reports.document import phase_dict
from ..reports.outcome import ItemOutcome, plain_entry
from ..reports.text import PhaseReport, summary_line
from ..trace.environment import summary_changes
from ..vocabulary import Phase, UpdatePolicy
from .messages import accept_command, baseline_dict, mismatch_message, updated_message, written_message
from .store import BaselineOutcome


def update_policy(update: bool, update_all: bool) -> UpdatePolicy:
    """``--align-update`` / ``--align-update-all`` as the store's update policy."""
    if update_all:
        return "all"
    return "mismatched" if update else "none"


def baseline_outcome(
    outcome: BaselineOutcome,
    case: CaseSpec,
    phase: Phase,
    nodeid: str,
    *,
    config_path: Path,
    rel: Path | str,
    root: str,
) -> ItemOutcome:
    """One phase item's outcome against the stored baseline. ``config_path`` is the config
    file, ``rel`` the same as the user names it, ``root`` the ``--align-baseline`` folder."""
    name = f"{case.name}[{phase}]"
    accept = accept_command(rel, root, case.name)
    action = (("precalign_baseline", outcome.action),)
    if outcome.run is None:  # written now, or earlier in this run
        return _written(outcome, name, phase, nodeid, config_path, accept)
    report = PhaseReport.of_run(
        outcome.run,
        phase,
        defined_in=str(config_path),
        baseline=f"stored {outcome.path}",
        candidate=case.sides.names[1],
        reproduce=f'pytest --align-config {rel} --align-baseline {root} "{nodeid}"',
    )
    data = {**phase_dict(report), "baseline": baseline_dict(outcome), "nodeid": nodeid}
    if outcome.action == "rewritten":  # --align-update-all: accepted whatever it found
        return ItemOutcome(
            name,
            passed=True,
            summary=f"PASSED {name}: baseline rewritten (--align-update-all): {outcome.path}",
            entry=plain_entry({**data, "passed": True}),
            properties=(*action, ("precalign_passed", True)),
        )
    verdict = report.verdict
    passed = verdict.passed and outcome.action != "updated"
    first = (("precalign_first_divergence", verdict.first.name),) if verdict.first is not None else ()
    message = ""
    if not verdict.passed:
        message = mismatch_message(outcome, report, accept)
    elif outcome.action == "updated":
        message = updated_message(outcome)
    updated = f"; baseline {outcome.action}" if outcome.action == "updated" else ""
    if outcome.variants > 1:
        updated += f"; baseline variant {outcome.variant or 'default'} (closest of {outcome.variants})"
    changes = summary_changes(outcome.env_diff, sys.modules)
    if changes:  # an upgrade that passes says what it passed across (all of it in the message)
        updated += f"; since the baseline: {', '.join(changes[:3])}"
        updated += f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
    return ItemOutcome(
        name,
        passed=passed,
        message=message,
        summary=summary_line(report) + updated,
        entry=plain_entry({**data, "passed": passed}),
        properties=(*action, ("precalign_passed", passed), *first),
    )


def _written(
    outcome: BaselineOutcome, name: str, phase: Phase, nodeid: str, config_path: Path, accept: str
) -> ItemOutcome:
    """A baseline written now (or by another worker earlier in this run): the item fails."""
    entry = {
        "config": str(config_path),
        "name": outcome.case,
        "phase": phase,
        "passed": False,
        "first_divergence": None,
        "baseline": baseline_dict(outcome),
        "nodeid": nodeid,
    }
    return ItemOutcome(
        name,
        passed=False,
        message=written_message(outcome, accept),
        summary=f"FAILED {name}: baseline {outcome.action}: {outcome.path}",
        entry=plain_entry(entry),
        properties=(("precalign_baseline", outcome.action),),
    )
