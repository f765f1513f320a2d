"""Mutation benchmark: seeded faults in HF Qwen2, a hand-written port and megatron-core, and
fault-free pairs; prints detection, localisation and false-alarm rates.

Writes one align.yaml holding every case (mutations applied through each candidate's
``patch:``, the port's seeded bugs, or a mistaken mapping file), runs it in one pytest session
(``python -m pytest --align-config ... --align-report DIR``) and scores DIR/report.json:
detected = some phase of the case failed; localised = the reported origin module equals the
expected one; false alarm = a fault-free pair that fails. The last line of stdout is one JSON
object.

    python benchmarks/mutations.py                 # everything, including two torchrun cases
    python benchmarks/mutations.py --no-distributed
    python benchmarks/mutations.py --only hf_attn_scale,clean_eager_vs_sdpa
    python benchmarks/mutations.py --training      # the training-level mutations instead
                                                   # (benchmarks/training_mutations.py)
    python benchmarks/mutations.py --training --recorded   # ... on a user's recorded runs
                                                   # (benchmarks/recorded_runs.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mutation_catalogue import Case, clean_pairs, mapping_files, mutations, suite  # noqa: E402

PHASE_ORDER = ("forward", "backward", "step")
PRESET_FILE = HERE.parent / "src" / "pytest_precalign" / "presets" / "megatron-qwen2.5.yaml"


def select(only: str | None, distributed: bool) -> list[Case]:
    cases = mutations() + clean_pairs()
    if only:
        wanted = [n.strip() for n in only.split(",") if n.strip()]
        known = {c.name for c in cases}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise SystemExit(
                f"mutations.py: error: --only: unknown case(s) {', '.join(unknown)} (allowed: {', '.join(sorted(known))})"
            )
        cases = [c for c in cases if c.name in wanted]
    if not distributed:
        cases = [c for c in cases if not c.launched]
    return cases


def write_suite(cases: list[Case], work: Path) -> Path:
    maps = work / "mappings"
    maps.mkdir()
    preset = yaml.safe_load(PRESET_FILE.read_text())
    for name, body in mapping_files(preset).items():
        (maps / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    config = work / "align.yaml"
    config.write_text(yaml.safe_dump(suite(cases, str(maps)), sort_keys=False))
    return config


def run_suite(config: Path, work: Path, workers: int) -> tuple[list[dict[str, Any]], str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(work),
        "--align-config",
        str(config),
        "--align-report",
        str(work / "report"),
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(work),
        "-W",
        "ignore",
    ]
    if workers > 1:
        cmd += ["-n", str(workers)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    report = work / "report" / "report.json"
    if not report.exists():
        sys.stderr.write(proc.stdout[-5000:] + proc.stderr[-5000:])
        raise SystemExit(f"mutations.py: error: pytest wrote no {report} (exit {proc.returncode})")
    document = json.loads(report.read_text())
    entries = document["cases"] if isinstance(document, dict) and "cases" in document else document
    return list(entries), proc.stdout


def reported_origin(entries: list[dict[str, Any]]) -> tuple[bool, str | None, str | None]:
    """(failed, origin module, phase) of one case's entries: a case-level ``origin`` object if
    the report has one, else the earliest failing phase's first_divergence.origin_module."""
    failing = sorted(
        (e for e in entries if not e.get("passed", False)), key=lambda e: PHASE_ORDER.index(e["phase"])
    )
    if not failing:
        return False, None, None
    for e in entries:
        origin = e.get("origin")
        if isinstance(origin, dict) and origin.get("module"):
            return True, str(origin["module"]), str(origin.get("phase"))
    first = failing[0]
    div = first.get("first_divergence") or {}
    module = div.get("origin_module") or div.get("name")
    return True, module, first["phase"]


def score(cases: list[Case], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for case in cases:
        mine = [e for e in entries if e.get("name") == case.name]
        failed, module, phase = reported_origin(mine)
        rows.append(
            {
                "name": case.name,
                "family": case.family,
                "fault": case.fault,
                "what": case.what,
                "phase": phase or "-",
                "expected": case.expected or "-",
                "reported": module or "-",
                "ran": bool(mine),
                "failed": failed,
                "localised": case.expected is not None and failed and module == case.expected,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("name", "family", "fault", "phase", "expected", "reported", "detected", "localised")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        mutation = r["expected"] != "-"
        det = ("yes" if r["failed"] else "NO") if mutation else ("FALSE ALARM" if r["failed"] else "clean")
        loc = ("yes" if r["localised"] else "NO") if mutation else "-"
        if not r["ran"]:
            det = loc = "NOT RUN"
        print(
            f"| {r['name']} | {r['family']} | {r['fault']} | {r['phase']} | `{r['expected']}` | `{r['reported']}` | {det} | {loc} |"
        )


def main() -> None:
    if "--training" in sys.argv[1:]:  # the training-level benchmark takes the rest of the line
        argv = [a for a in sys.argv[1:] if a != "--training"]
        if "--recorded" in argv:  # a user's runs, recorded by the callback / Recorder (recorded_runs.py)
            import recorded_runs

            raise SystemExit(recorded_runs.main([a for a in argv if a != "--recorded"]))
        import training_mutations

        raise SystemExit(training_mutations.main(argv))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument(
        "--no-distributed",
        dest="distributed",
        action="store_false",
        help="skip the two torchrun cases (TP=1 vs TP=2, the TP shard error)",
    )
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (default 1)")
    parser.add_argument("--keep", help="write the suite and report into this directory")
    args = parser.parse_args()
    cases = select(args.only, args.distributed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="precalign-mutations-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        config = write_suite(cases, work)
        entries, _ = run_suite(config, work, args.workers)
    rows = score(cases, entries)
    muts = [r for r in rows if r["expected"] != "-"]
    clean = [r for r in rows if r["expected"] == "-"]
    detected = sum(r["failed"] for r in muts)
    localised = sum(r["localised"] for r in muts)
    alarms = sum(r["failed"] for r in clean)
    print_table(rows)
    pct = lambda a, b: f"{100.0 * a / b:.1f} %" if b else "n/a"  # noqa: E731
    print(
        f"\ndetected {detected}/{len(muts)} ({pct(detected, len(muts))}), localised {localised}/{len(muts)} "
        f"({pct(localised, len(muts))}), false alarms {alarms}/{len(clean)} ({pct(alarms, len(clean))}); "
        f"{time.perf_counter() - start:.0f} s"
    )
    for r in muts:
        if not r["localised"]:
            print(
                f"  missed or mislocalised: {r['name']}: expected {r['expected']}, reported {r['reported']} ({r['phase']})"
            )
    print(
        json.dumps(
            {
                "detected": detected,
                "localised": localised,
                "false_alarms": alarms,
                "mutations": len(muts),
                "clean_pairs": len(clean),
                "not_run": [r["name"] for r in rows if not r["ran"]],
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
