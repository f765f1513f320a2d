"""``--align-baseline`` for the plugin's test items: run a case's candidate once for all its
phase items, check it against the stored baseline, and turn the outcome into each item's
verdict. Called from ``plugin.AlignItem``; pytest itself is not imported here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import AlignmentMismatch, PrecalignError

if TYPE_CHECKING:
    from ..config.specs import AlignConfig, CaseSpec
    from .store import BaselineOutcome


def update_mode(config: Any) -> str:
    if config.getoption("align_update_all"):
        return "all"
    return "mismatched" if config.getoption("align_update") else "none"


def _outcome(config: Any, state: Any, align_config: AlignConfig, case: CaseSpec) -> BaselineOutcome:
    """One check per case and process; freed after its last phase item."""
    from .store import check_case

    runs, pending = state.baseline_runs, state.pending
    key = f"baseline:{case.name}"
    if key not in runs:
        root = Path(config.getoption("align_baseline"))
        try:
            runs[key] = check_case(align_config, case, root, update_mode(config), state.run_id)
        except PrecalignError as exc:
            runs[key] = exc
        pending.setdefault(key, len(case.phases))
    result = runs[key]
    pending[key] = pending.get(key, 1) - 1
    if pending[key] <= 0:
        del runs[key], pending[key]
    if isinstance(result, PrecalignError):
        raise result
    return result  # type: ignore[no-any-return]


def run_against_baseline(item: Any, state: Any) -> None:
    from ..reports.document import phase_dict
    from ..reports.text import PhaseReport, summary_line
    from .messages import accept_command, baseline_dict, mismatch_message, updated_message, written_message

    config, case, phase = item.config, item.case, item.phase
    align_config: AlignConfig = state.config
    outcome = _outcome(config, state, align_config, case)
    try:
        rel: Path | str = align_config.path.relative_to(config.rootpath)
    except ValueError:
        rel = align_config.path
    root = config.getoption("align_baseline")
    accept = accept_command(rel, root, case.name)
    item.user_properties.append(("precalign_baseline", outcome.action))
    if outcome.run is None:  # written now, or earlier in this run
        message = written_message(outcome, accept)
        state.summaries.append(f"FAILED {case.name}[{phase}]: baseline {outcome.action}: {outcome.path}")
        state.reports.append(
            {
                "config": str(align_config.path),
                "name": case.name,
                "phase": phase,
                "passed": False,
                "first_divergence": None,
                "baseline": baseline_dict(outcome),
                "nodeid": item.nodeid,
            }
        )
        raise AlignmentMismatch(message)
    run = outcome.run
    report = PhaseReport(
        config=str(align_config.path),
        case=case.name,
        phase=phase,
        verdict=run.verdicts[phase],
        baseline=f"stored {outcome.path}",
        candidate=case.candidate,
        table=run.table,
        reproduce=f'pytest --align-config {rel} --align-baseline {root} "{item.nodeid}"',
        seconds=run.seconds,
    )
    data = {**phase_dict(report), "baseline": baseline_dict(outcome), "nodeid": item.nodeid}
    if outcome.action == "rewritten":  # --align-update-all: accepted whatever it found
        data["passed"] = True
        state.reports.append(data)
        state.summaries.append(
            f"PASSED {case.name}[{phase}]: baseline rewritten (--align-update-all): {outcome.path}"
        )
        item.user_properties.append(("precalign_passed", True))
        return
    passed = report.verdict.passed and outcome.action != "updated"
    data["passed"] = passed
    state.reports.append(data)
    state.summaries.append(
        summary_line(report) + (f"; baseline {outcome.action}" if outcome.action == "updated" else "")
    )
    item.user_properties.append(("precalign_passed", passed))
    if report.verdict.first is not None:
        item.user_properties.append(("precalign_first_divergence", report.verdict.first.name))
    if not report.verdict.passed:
        raise AlignmentMismatch(mismatch_message(outcome, report, accept))
    if outcome.action == "updated":
        raise AlignmentMismatch(updated_message(outcome))
