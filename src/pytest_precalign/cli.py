"""``precalign``: run or validate alignment cases, or compare stored runs, outside pytest.

Exit codes: 0 aligned (or valid), 1 diverged, 2 usage error (bad config, source, option).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, PrecalignError
from .redaction import redacted_output

if TYPE_CHECKING:
    from .config.specs import AlignConfig, CaseSpec
    from .reports.outcome import ItemOutcome


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precalign", description="Alignment regression testing of deep-learning models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the cases of a config and print verdicts")
    run.add_argument("config", help="alignment config YAML")
    run.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    run.add_argument("--report", metavar="DIR", help="write report.json and report.html into DIR")
    run.add_argument("--save-traces", metavar="DIR", help="save traces under DIR/<case>/ (never overwrites)")
    run.add_argument("--trust-checkpoint", action="store_true", help=TRUST_HELP)
    validate = sub.add_parser("validate", help="check a config and its model sources without running")
    validate.add_argument("config", help="alignment config YAML")
    _compare_parser(sub.add_parser("compare", help="compare two stored runs (trace directories)"))
    _check_weights_parser(sub)
    _calibrate_parser(sub)
    _record_parser(sub)
    env_diff = sub.add_parser(
        "env-diff",
        help="compare the environments two runs were recorded in (exit 0 same, 1 differs, 2 bad input)",
    )
    env_diff.add_argument("first", help="a recorded run: a trace or baseline folder, or its manifest.json")
    env_diff.add_argument("second", help="the other recorded run")
    return parser


TRUST_HELP = (
    "fully unpickle the checkpoints' pickled files (Megatron model_optim_rng.pt, torch_dist .metadata): "
    "only for checkpoints you trust, as unpickling can run code from the file"
)


def _calibrate_parser(sub: Any) -> None:
    calibrate = sub.add_parser(
        "calibrate", help="measure each layer's noise floor and write a tolerance table YAML"
    )
    calibrate.add_argument("config", nargs="?", help="alignment config YAML")
    calibrate.add_argument(
        "--config", dest="config_flag", metavar="CONFIG", help="deprecated: give the config positionally"
    )
    calibrate.add_argument("--case", action="append", default=[], help="calibrate this case (repeatable)")
    calibrate.add_argument("--out", required=True, metavar="FILE", help="tolerance table YAML to write")
    calibrate.add_argument("--margin", default="4", help="bound = margin x measured floor (default 4)")
    calibrate.add_argument(
        "--perturbations", default="float64,attn,seed", help="comma-separated: float64, attn, seed"
    )
    calibrate.add_argument("--force", action="store_true", help="replace an existing table")


def _record_parser(sub: Any) -> None:
    record = sub.add_parser(
        "record",
        help="record one side of cases (and its weights) as stored baselines DIR/<case>/",
    )
    record.add_argument("config", help="alignment config YAML")
    record.add_argument(
        "--out", required=True, metavar="DIR", help="write DIR/<case>/ (as --align-baseline reads)"
    )
    record.add_argument("--case", action="append", default=[], help="record only this case (repeatable)")
    record.add_argument(
        "--side",
        choices=("candidate", "baseline"),
        default="candidate",
        help="which model of the case to record (default: candidate)",
    )
    record.add_argument("--overwrite", action="store_true", help="replace an existing DIR/<case>/")
    record.add_argument(
        "--variant",
        default="",
        metavar="LABEL",
        help="record an environment variant DIR/<case>@LABEL/ (a run compares with the closest variant)",
    )


def _check_weights_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check-weights", help="compare two checkpoints' tensors through a mapping (names, shapes, values)"
    )
    check.add_argument("first", help="checkpoint folder, the mapping's baseline side (e.g. HF)")
    check.add_argument("second", help="checkpoint folder, the mapping's candidate side (e.g. Megatron)")
    check.add_argument("--mapping", metavar="FILE", help="mapping YAML, or preset:NAME")
    check.add_argument(
        "--var", action="append", default=[], metavar="KEY=INT", help="a $variable of the mapping"
    )
    check.add_argument("--trust-checkpoint", action="store_true", help=TRUST_HELP)


def _check_weights(args: argparse.Namespace) -> int:
    from .checkpoints.compare import compare_checkpoints, load_checkpoint
    from .config.presets import manifest_variables
    from .run.offline import load_mapping

    # A mapping's $variables: the folders' own config.json (an HF checkpoint's), then --var.
    configs = [_hf_config(Path(folder)) for folder in (args.first, args.second)]
    known = manifest_variables(*({"model_config": {"source": "transformers", "fields": c}} for c in configs))
    mapping = load_mapping(args.mapping, {**known, **_variables(args.var)})
    trust = args.trust_checkpoint
    first = load_checkpoint(Path(args.first), trust=trust)
    diff = compare_checkpoints(first, load_checkpoint(Path(args.second), trust=trust), mapping)
    print("\n".join(diff.lines()))
    return 0 if diff.aligned else 1


def _hf_config(folder: Path) -> dict[str, Any]:
    """An HF checkpoint folder's ``config.json`` (its text config for a multimodal one); {}
    without one. Read as JSON only (nothing is executed)."""
    import json

    file = folder / "config.json"
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not a readable JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a JSON object, got {type(data).__name__}")
    text = data.get("text_config")
    return {**data, **text} if isinstance(text, dict) else data


def _compare_parser(compare: argparse.ArgumentParser) -> None:
    compare.add_argument(
        "baseline", nargs="?", metavar="BASELINE", help="the baseline side (msprobe: golden, bench)"
    )
    compare.add_argument(
        "candidate", nargs="?", metavar="CANDIDATE", help="the candidate side (msprobe: target, npu)"
    )
    compare.add_argument(
        "--parallel",
        action="append",
        default=[],
        metavar="SIDE:tp=T,pp=P[,vpp=V][,order=...][,replicas=auto|joined|same]",
        help="merge that side's ranks (baseline or candidate; an msprobe dump's layout) before comparing; "
        "replicas: DP replicas that saw different rows joined along the batch (auto: when they did), "
        "or copies that must agree (same)",
    )
    compare.add_argument(
        "--msprobe-config",
        metavar="FILE",
        help="msprobe compare.json: bench_path (baseline), npu_path (candidate), parallel_merge",
    )
    compare.add_argument(
        "--tolerances", metavar="FILE", help="tolerance table YAML (default: torch.testing's per dtype)"
    )
    compare.add_argument("--mapping", metavar="FILE", help="mapping YAML, or preset:NAME")
    compare.add_argument(
        "--layer-mapping",
        metavar="FILE",
        help="msprobe layer_mapping YAML, or preset:NAME (the templates shipped in presets/)",
    )
    compare.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="KEY=INT",
        help="a $variable of the mapping (repeatable)",
    )
    compare.add_argument(
        "--fuzzy-match", action="store_true", help="pair API calls by their order inside each module"
    )
    compare.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="FILE.py:FUNCTION",
        help="a custom metric f(baseline, candidate) -> float, reported per tensor pair (repeatable)",
    )
    compare.add_argument("--report", metavar="DIR", help="write report.json and report.html into DIR")
    compare.add_argument(
        "--min-coverage",
        metavar="SHARE",
        help="fail a phase in which less than this share (0..1) of the baseline side's output "
        "records found a partner (default 0.5; nothing compared always fails)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The command; everything it prints passes through the redaction rule (docs/security.md)."""
    with redacted_output():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    try:
        code = _dispatch(args, argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is answered below
        return code
    except PrecalignError as exc:
        print(f"precalign: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C (SIGINT): one line, the shell's code for it
        print("precalign: interrupted (SIGINT); nothing more was done", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (``| head``): no traceback, no flush error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("precalign: error: output closed before it was all written (broken pipe)", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    if getattr(args, "report", None):
        from .reports.document import check_report_dir

        check_report_dir(args.report)
    if args.command == "validate":
        return _validate(Path(args.config))
    if args.command == "compare":
        return _compare(args)
    if args.command == "calibrate":
        return _calibrate(args, argv)
    if args.command == "check-weights":
        return _check_weights(args)
    if args.command == "env-diff":
        return _env_diff(args.first, args.second)
    if args.command == "record":
        from .baseline.command import record_cases
        from .reports.document import check_report_dir

        check_report_dir(args.out, "--out", "each case's baseline")
        for line in record_cases(
            Path(args.config), Path(args.out), args.case, args.side, args.overwrite, args.variant
        ):
            print(line)
        return 0
    return _run(Path(args.config), args.case, args.report, args.save_traces, args.trust_checkpoint)


def _progress_bar() -> Callable[[int, int], None] | None:
    """A one-line progress bar on stderr for long compares, only on a terminal."""
    if not sys.stderr.isatty():
        return None
    shown = [-1]

    def update(done: int, total: int) -> None:
        percent = 100 * (done + 1) // max(total, 1)
        if percent != shown[0] and total > 200:
            shown[0] = percent
            end = "\n" if done + 1 >= total else ""
            print(
                f"\rcomparing: {percent:3d}% ({done + 1}/{total} records)",
                end=end,
                file=sys.stderr,
                flush=True,
            )

    return update


def _variables(pairs: list[str]) -> dict[str, int]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value.lstrip("-").isdigit():
            raise ConfigError(f"--var: expected KEY=INTEGER (e.g. num_attention_heads=4), got {pair!r}")
        out[key] = int(value)
    return out


def _min_coverage(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise ConfigError(
            f"--min-coverage: expected a share between 0 and 1 (e.g. 0.5: half the baseline side's "
            f"output records paired), got {value!r}"
        )
    return share


def _compare(args: argparse.Namespace) -> int:
    from .parallel.layout import compare_sides
    from .reports.document import write_reports
    from .run.offline import OfflineOptions, compare_outcomes, compare_run_sets

    args.baseline, args.candidate, layouts = compare_sides(
        args.baseline, args.candidate, args.parallel, args.msprobe_config
    )
    options = OfflineOptions(
        tolerances=args.tolerances,
        mapping=args.mapping,
        variables=_variables(args.var),
        layer_mapping=args.layer_mapping,
        fuzzy_match=args.fuzzy_match,
        metrics=args.metric,
        progress=_progress_bar(),
        min_coverage=_min_coverage(args.min_coverage),
    )
    runs = compare_run_sets(args.baseline, args.candidate, layouts, options)
    outcomes = compare_outcomes(args.baseline, args.candidate, runs)
    from .trace.environment import compare_heading

    print("\n".join(compare_heading(args.baseline, args.candidate)))
    for note in dict.fromkeys(note for _, run in runs for note in run.notes):
        print(note)
    _print_outcomes(outcomes)
    if args.report:
        entries = [o.entry for o in outcomes if o.entry is not None]
        write_reports(
            args.report, entries, {"baseline": str(args.baseline), "candidate": str(args.candidate)}
        )
    return _exit_code(outcomes)


def _print_outcomes(outcomes: Sequence[ItemOutcome]) -> None:
    for outcome in outcomes:
        print(outcome.summary)
        if not outcome.passed:
            print("  " + outcome.message.replace("\n", "\n  "))


def _env_diff(first: str, second: str) -> int:
    from .trace.environment import diff_lines, read_manifest

    lines, differs = diff_lines(read_manifest(first), read_manifest(second), first, second)
    print("\n".join(lines))
    return 1 if differs else 0


def _exit_code(outcomes: Sequence[ItemOutcome]) -> int:
    """0 when every item passed, 1 when one diverged (usage errors exit 2, in ``main``)."""
    return 0 if all(o.passed for o in outcomes) else 1


def _calibrate(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from .calibration.rules import run_calibration

    if (args.config is None) == (args.config_flag is None):
        raise ConfigError("calibrate: give the config once, as `precalign calibrate CONFIG --out FILE`")
    if args.config_flag is not None:  # the deprecated spelling, still accepted
        args.config = args.config_flag
    if Path(args.out).is_dir():
        raise ConfigError(
            f"--out: {args.out} is a directory; expected the tolerance table YAML file to write"
        )

    words = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(["precalign", *(w if w and " " not in w else repr(w) for w in words)])
    lines = run_calibration(
        Path(args.config), args.case, Path(args.out), args.margin, args.perturbations, args.force, command
    )
    print("\n".join(lines))
    return 0


def _validate(path: Path) -> int:
    from .config.loader import load_config_file
    from .run.devices import check_devices

    config = load_config_file(path)
    for case in config.cases:
        check_devices(config, case)  # before torch is imported: torch_npu without CANN stops it
    from .run.case import preflight_case

    for case in config.cases:
        preflight_case(config, case)
    print(f"{config.path}: valid ({len(config.cases)} case(s), {len(config.models)} model(s))")
    return 0


def _run(path: Path, cases: list[str], report_dir: str | None, traces: str | None, trust: bool) -> int:
    from .config.loader import load_config_file
    from .config.model_weights import trust_checkpoints
    from .reports.document import write_reports
    from .run.devices import check_devices

    config = load_config_file(path)
    if trust:
        config = trust_checkpoints(config)
    selected = [config.case(name) for name in cases] if cases else list(config.cases)
    for case in selected:
        check_devices(config, case)  # before torch is imported: torch_npu without CANN stops it
    from .run.case import preflight_case

    for case in selected:
        preflight_case(config, case)
    outcomes: list[ItemOutcome] = []
    for case in selected:
        phases = _run_case(config, case, path, traces)
        outcomes += phases
        if case.search is not None:
            outcomes.append(_search(config, case, path))
    failed = _exit_code(outcomes)
    if report_dir:
        entries = [o.entry for o in outcomes if o.entry is not None]
        write_reports(report_dir, entries, {"config": str(config.path), "exitstatus": failed})
    return failed


def _run_case(config: AlignConfig, case: CaseSpec, path: Path, traces: str | None) -> list[ItemOutcome]:
    """Run one case and print its phases' verdicts, then save its traces under ``traces``
    (the verdicts come first: a full disk does not hide them); its phases' outcomes."""
    from .reports.outcome import phase_outcome
    from .reports.text import PhaseReport
    from .run.case import run_case
    from .run.stored_runs import save_case_traces

    run = run_case(config, case)
    phases = [
        phase_outcome(
            PhaseReport.of_run(
                run,
                phase,
                defined_in=str(config.path),
                baseline=case.sides.names[0],
                candidate=case.sides.names[1],
                reproduce=f"precalign run {path} --case {case.name}",
                with_environment=True,
            )
        )
        for phase in case.phases
    ]
    _print_outcomes(phases)
    sys.stdout.flush()
    if traces:
        root = Path(traces) / config.path.stem / case.name
        save_case_traces(run.baseline, run.candidate, root, case.record.format)
    return phases


def _search(config: AlignConfig, case: CaseSpec, path: Path) -> ItemOutcome:
    """A case's divergence search (``search:``), printed."""
    from .search import run_search, search_outcome

    result = run_search(config, case)
    outcome = search_outcome(result, config, f"precalign run {path} --case {case.name}")
    if outcome.passed:
        print(f"PASSED {case.name}[search]: {result.tried} examples, no divergence")
    else:
        print(f"FAILED {case.name}[search]")
        print("  " + outcome.message.replace("\n", "\n  "))
    return outcome
