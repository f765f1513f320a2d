"""A public benchmark of real silent bugs (issue #46, item 1): bugs of the training and
inference stacks users run (transformers, TRL, PEFT, accelerate, torch, Lightning), each
reproduced at CPU scale, each with its public source and a clean twin, each run through the
path a user hitting it takes (``PrecalignCallback``, ``Recorder``, ``AccelerateSteps``,
``PrecalignLightningCallback``, an upgrade baseline), then judged by ``precalign compare`` as
CI would.

Each bug is a small script in ``benchmarks/real_bugs/`` (``python CASE.py OUT SIDE``) that
records the run with the bug's trigger on under ``OUT/SIDE`` and its clean twin (the same run,
trigger off) under ``OUT/SIDE_twin``, SIDE being ``fixed`` or ``buggy``. A bug whose buggy and
fixed releases are both on the package registry runs each side under its release's venv
(made under ``--venvs`` on first use and kept: ``python3.11 -m venv``, ``torch==2.13.0``, the
release, this checkout's dependencies); the others are minimal re-implementations that quote
the fix's diff in their docstring, run in the current interpreter, both sides in one process
(``python CASE.py OUT fixed buggy``). The catalogue (names,
sources, expected verdicts) is ``real_bugs/__init__.py``.

Scores, per bug: detected (``precalign compare fixed buggy`` exits 1), right step (the run
verdict's ``first_divergent_step``), right class (``first_divergent``), right origin (the
verdict's origin holds the expected module; for a settings bug, its origin or evidence names
the setting or parameter), false alarm (the twins'
compare does not exit 0). A wrong verdict is recorded as the tool gave it, never adjusted.

    python benchmarks/real_bugs.py                        # every bug; venvs in .venv-real-bugs/
    python benchmarks/real_bugs.py --only gemma_gelu_tanh,packing_cross_attention
    python benchmarks/real_bugs.py --venvs DIR --keep /tmp/rb   # keep the recordings
    python benchmarks/real_bugs.py --judge-only /tmp/rb   # judge kept recordings again
    python benchmarks/real_bugs.py --no-releases          # skip the bugs that need release venvs

Results: ``--out benchmarks/results/real_bugs`` writes ``real_bugs.md`` and ``real_bugs.json``.
The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CASES = HERE / "real_bugs"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

from real_bugs import BUGS, CANDIDATES, Bug  # noqa: E402

# What every release venv gets besides the release itself: this checkout's dependencies, and
# a setuptools that still has pkg_resources (removed in 81; accelerate 0.16 imports it).
BASE_REQUIREMENTS = ("pytest", "pyyaml", "safetensors", "numpy", "packaging", "setuptools<81")


def venv_python(venvs: Path, release: str | None) -> str:
    """The interpreter of ``release``'s venv under ``venvs`` (made on first use), or this one."""
    if release is None:
        return sys.executable
    folder = venvs / ("real-bugs-" + release.split()[0].replace("==", "-"))
    ready = folder / ".ready"
    if not ready.is_file() or ready.read_text(encoding="utf-8").strip() != release:
        # a venv named by the release's first requirement holds that release only; any other
        # set of requirements gets a venv named by all of them (never one made for another set)
        folder = venvs / ("real-bugs-" + "-".join(r.replace("==", "-") for r in release.split()))
    python = folder / "bin" / "python"
    if (folder / ".ready").is_file():
        return str(python)
    print(f"making {folder} ({release}); kept for later runs", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(folder)],
        # torch 2.13's CPU build first, unless the release is a torch release itself (a torch
        # bug's sides: PyPI's Linux wheels of older torch are CUDA builds, ~5 GB a venv with
        # their nvidia wheels)
        *([] if "torch==" in release else [[str(python), "-m", "pip", "install", "-q", "torch==2.13.0"]]),
        [str(python), "-m", "pip", "install", "-q", *release.split(), *BASE_REQUIREMENTS],
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO)],
    ]
    for command in steps:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"real_bugs.py: {' '.join(command)} failed:\n{done.stderr[-2000:]}")
    (folder / ".ready").write_text(release + "\n", encoding="utf-8")
    return str(python)


def record(bug: Bug, sides: tuple[str, ...], python: str, out: Path) -> dict[str, Any]:
    """Run the bug's script for ``sides`` under ``python`` (one process): its exit and seconds."""
    started = time.perf_counter()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(CASES)]),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }
    done = subprocess.run(
        [python, str(CASES / f"{bug.name}.py"), str(out), *sides], env=env, capture_output=True, text=True
    )
    return {
        "exit": done.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "error": done.stderr[-1500:] if done.returncode else "",
    }


def judge(base: Path, cand: Path, report: Path) -> dict[str, Any]:
    """``precalign compare BASE CAND --report REPORT`` (the CLI's ``main``, in this process):
    its exit code, the run verdict of report.json and the line that tells it."""
    from pytest_precalign.cli import main as precalign

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code: int | str = precalign(["compare", str(base), str(cand), "--report", str(report)])
    except Exception as exc:  # a traceback is a finding of the benchmark, not its end
        code = "crash"
        out.write(f"{type(exc).__name__}: {exc}")
    file = report / "report.json"
    training = json.loads(file.read_text()).get("training") if file.is_file() else None
    training = training if isinstance(training, dict) else {}
    lines = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
    told = [
        line
        for line in lines
        if line.startswith("Step ") and "diverged first" in line or line.startswith("Runs do not line up")
    ]
    said = next(
        (
            line
            for line in told + lines
            if "diverged first" in line or "do not line up" in line or "rror" in line
        ),
        lines[-1] if lines else "",
    )
    return {
        "exit": code,
        "found": [
            training.get("first_divergent_step"),
            training.get("first_divergent"),
            training.get("origin"),
        ],
        "evidence": str(training.get("evidence") or "")[:300],
        "said": said[:400],
    }


def how(bug: Bug) -> str:
    """``releases (buggy -> fixed)``, or ``re-implementation``."""
    if bug.buggy_release or bug.fixed_release:
        names = [r.split()[0] if r else "this venv" for r in (bug.buggy_release, bug.fixed_release)]
        return f"releases ({names[0]} -> {names[1]})"
    return "re-implementation"  # why: the results' "Why no release" section


def _names(expected: str, named: str) -> bool:
    """``named`` holds the expected origin (``=name``: is exactly it)."""
    return named == expected[1:] if expected.startswith("=") else expected in named


def score(bug: Bug, fault: dict[str, Any], twin: dict[str, Any]) -> dict[str, Any]:
    step, what, origin = fault["found"]
    # a settings difference is named in the evidence ("weight_decay of model.norm.weight"); any
    # other origin by the verdict's origin itself (its evidence may name a downstream module)
    named = f"{origin or ''} {fault['evidence']}" if "settings" in bug.what.split("|") else str(origin or "")
    return {
        "name": bug.name,
        "stack": bug.stack,
        "source": bug.source,
        "how": how(bug),
        "why_no_release": bug.why_no_release,
        "path": bug.path,
        "expected": [bug.step, bug.what, bug.origin],
        "fault": fault,
        "twin": twin,
        "detected": fault["exit"] == 1,
        "right_step": fault["exit"] == 1 and step == bug.step,
        "right_class": fault["exit"] == 1 and step == bug.step and what in bug.what.split("|"),
        "right_origin": fault["exit"] == 1 and any(_names(o, named) for o in bug.origin.split("|")),
        "false_alarm": twin["exit"] != 0,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [r for r in rows if "detected" in r]
    return {
        "bugs": len(rows),
        "ran": len(ran),
        "detected": sum(r["detected"] for r in ran),
        "right_step": sum(r["right_step"] for r in ran),
        "right_class": sum(r["right_class"] for r in ran),
        "right_origin": sum(r["right_origin"] for r in ran),
        "false_alarms": sum(r["false_alarm"] for r in ran),
        "twins": len(ran),
        "crashed": sum(r["fault"]["exit"] == "crash" or r["twin"]["exit"] == "crash" for r in ran),
    }


def _cell(found: list[Any]) -> str:
    return ", ".join(str(v) for v in found if v not in (None, "")) or "-"


def markdown(rows: list[dict[str, Any]], figures: dict[str, Any], command: str) -> str:
    n = figures["ran"]
    out = [
        "# Real silent bugs: what `precalign compare` says",
        "",
        f"Reproduce: `{command}` ({figures['seconds']} s this run, {figures['recording']}; release venvs "
        "made once under `--venvs`). Catalogue, sources and expected verdicts: `benchmarks/real_bugs/__init__.py`; "
        "each bug's reproduction: `benchmarks/real_bugs/<name>.py`; what each bug is: `docs/real_bugs.md`.",
        "",
        f"**{figures['detected']}/{n} detected, right step {figures['right_step']}/{n}, right class "
        f"{figures['right_class']}/{n}, right origin {figures['right_origin']}/{n}, false alarms on the "
        f"clean twins {figures['false_alarms']}/{figures['twins']}** ({figures['bugs']} bugs catalogued, "
        f"{n} ran). Wrong verdicts are recorded as the tool gave them.",
        "",
        "| bug | stack | source | how | user path | expected (step, class, origin) | exit | found (step, class, origin) | step | class | origin | twin exit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "detected" not in r:
            out.append(
                f"| {r['name']} | {r['stack']} | {r['source']} | - | - | - | not run: {r['why']} | | | | | |"
            )
            continue
        mark = {True: "yes", False: "**no**"}
        out.append(
            f"| {r['name']} | {r['stack']} | {r['source']} | {r['how']} | {r['path']} | {_cell(r['expected'])} "
            f"| {r['fault']['exit']} | {_cell(r['fault']['found'])} | {mark[r['right_step']]} "
            f"| {mark[r['right_class']]} | {mark[r['right_origin']]} | {r['twin']['exit']} |"
        )
    out += ["", "## What the tool said", ""]
    for r in rows:
        if "detected" in r:
            out.append(f"- **{r['name']}**: {r['fault']['said']}")
            if r["false_alarm"]:
                out.append(f"  - twin (false alarm): {r['twin']['said']}")
    unreleased = [r for r in rows if r.get("why_no_release")]
    if unreleased:
        out += ["", "## Why no release", ""]
        out += [f"- **{r['name']}**: {r['why_no_release']}" for r in unreleased]
    out += ["", "## Candidates found but not yet reproduced", ""]
    out += [f"- {c}" for c in CANDIDATES]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", help="comma-separated bug names")
    parser.add_argument(
        "--venvs", default=str(REPO / ".venv-real-bugs"), help="where the release venvs are made and kept"
    )
    parser.add_argument("--no-releases", action="store_true", help="skip bugs that need release venvs")
    parser.add_argument("--keep", help="record into this directory (kept)")
    parser.add_argument("--judge-only", help="judge the recordings a --keep run left in this directory")
    parser.add_argument("--out", help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    known = {b.name for b in BUGS}
    wanted = {n.strip() for n in (args.only or "").split(",") if n.strip()}
    if wanted - known:
        parser.error(
            f"--only: unknown bug(s) {', '.join(sorted(wanted - known))} (allowed: {', '.join(sorted(known))})"
        )
    venvs = Path(args.venvs)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="precalign-real-bugs-") as tmp:
        work = Path(args.judge_only or args.keep or tmp)
        for bug in BUGS:
            if wanted and bug.name not in wanted:
                continue
            releases = bug.fixed_release or bug.buggy_release
            if releases and args.no_releases:
                rows.append(
                    {"name": bug.name, "stack": bug.stack, "source": bug.source, "why": "--no-releases"}
                )
                continue
            folder = work / bug.name
            recorded = {}
            if not args.judge_only:
                shutil.rmtree(folder, ignore_errors=True)
                python = {
                    side: venv_python(venvs, r)
                    for side, r in (("fixed", bug.fixed_release), ("buggy", bug.buggy_release))
                }
                # one process for both sides when they share an interpreter (the import paid once)
                same = python["fixed"] == python["buggy"]
                for sides in [("fixed", "buggy")] if same else [("fixed",), ("buggy",)]:
                    key = "+".join(sides)
                    recorded[key] = record(bug, sides, python[sides[0]], folder)
                    if recorded[key]["exit"] != 0:
                        print(f"{bug.name} {key}: recording failed\n{recorded[key]['error']}", flush=True)
            fault = judge(folder / "fixed", folder / "buggy", work / "reports" / bug.name)
            twin = judge(folder / "fixed_twin", folder / "buggy_twin", work / "reports" / f"{bug.name}_twin")
            rows.append({**score(bug, fault, twin), "recording": recorded})
            r = rows[-1]
            print(
                f"{bug.name}: expected {r['expected']}, exit {fault['exit']}, found {fault['found']}; "
                f"twin exit {twin['exit']}",
                flush=True,
            )
    figures = summary(rows)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    figures["recording"] = (
        f"judging recordings kept by an earlier run ({args.judge_only})"
        if args.judge_only
        else "recording and judging every bug"
    )
    command = "python benchmarks/real_bugs.py" + (f" --only {args.only}" if args.only else "")
    n = figures["ran"]
    print(
        f"\ndetected {figures['detected']}/{n}, right step {figures['right_step']}/{n}, right class "
        f"{figures['right_class']}/{n}, right origin {figures['right_origin']}/{n}, false alarms "
        f"{figures['false_alarms']}/{figures['twins']}; {figures['seconds']} s"
    )
    document = {**figures, "rows": rows, "candidates": list(CANDIDATES)}
    if args.out:
        Path(args.out + ".md").write_text(markdown(rows, figures, command), encoding="utf-8")
        Path(args.out + ".json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
