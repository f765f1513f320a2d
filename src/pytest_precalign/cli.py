"""``precalign``: run or validate alignment cases outside pytest.

Exit codes: 0 aligned (or valid), 1 diverged, 2 usage error (bad config, source, option).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import PrecalignError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precalign", description="Alignment regression testing of deep-learning models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the cases of a config and print verdicts")
    run.add_argument("config", help="alignment config YAML")
    run.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    run.add_argument("--report", metavar="DIR", help="write report.json into DIR")
    run.add_argument("--save-traces", metavar="DIR", help="save traces under DIR/<case>/ (never overwrites)")
    validate = sub.add_parser("validate", help="check a config and its model sources without running")
    validate.add_argument("config", help="alignment config YAML")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "validate":
            return _validate(Path(args.config))
        return _run(Path(args.config), args.case, args.report, args.save_traces)
    except PrecalignError as exc:
        print(f"precalign: error: {exc}", file=sys.stderr)
        return 2


def _validate(path: Path) -> int:
    from .config import load_config_file
    from .runner import preflight_case

    config = load_config_file(path)
    for case in config.cases:
        preflight_case(config, case)
    print(f"{config.path}: valid ({len(config.cases)} case(s), {len(config.models)} model(s))")
    return 0


def _run(path: Path, cases: list[str], report_dir: str | None, traces: str | None) -> int:
    from .config import load_config_file
    from .report import PhaseReport, failure_message, phase_dict, summary_line, write_json_report
    from .runner import preflight_case, run_case
    from .trace_io import write_trace

    config = load_config_file(path)
    selected = [config.case(name) for name in cases] if cases else list(config.cases)
    for case in selected:
        preflight_case(config, case)
    entries = []
    failed = False
    for case in selected:
        run = run_case(config, case)
        if traces:
            root = Path(traces) / config.path.stem / case.name
            write_trace(run.baseline, root / "baseline")
            write_trace(run.candidate, root / "candidate")
        for phase in case.phases:
            report = PhaseReport(
                config=str(config.path),
                case=case.name,
                phase=phase,
                verdict=run.verdicts[phase],
                baseline=case.baseline,
                candidate=case.candidate,
                table=run.table,
                reproduce=f"precalign run {path} --case {case.name}",
                seconds=run.seconds,
            )
            print(summary_line(report))
            if not report.verdict.passed:
                failed = True
                print("  " + failure_message(report).replace("\n", "\n  "))
            entries.append(phase_dict(report))
    if report_dir:
        write_json_report(report_dir, entries, {"config": str(config.path), "exitstatus": int(failed)})
    return 1 if failed else 0
