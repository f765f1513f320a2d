"""A user's path for training runs: their own script (``example_suites/recorded_runs/``) run in a
subprocess records runs; ``precalign compare`` (the CLI's ``main``) or a ``dump:`` case of an
inner pytest judges them; report.json's ``training`` object is what the tests read."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.session_once import locked

REPO = Path(__file__).resolve().parents[2]

SCRIPTS = REPO / "example_suites" / "recorded_runs"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}


def record(script: str, out: Path, *runs: str) -> Path:
    """``python example_suites/recorded_runs/<script> OUT RUN...`` (each RUN ``NAME:key=value,...``); ``out``."""
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), str(out), *runs],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def record_shared(tmp_path_factory: Any, script: str, folder: str, *runs: str) -> Path:
    """``record`` once per test session: the runs of ``script`` go to ``folder`` of the session's
    common temp folder (``session_once``); a run some test, in this module or another, on this
    xdist worker or another, already recorded there is reused (its RUN spec must be the same),
    the others are recorded; ``folder``'s path."""
    with locked(tmp_path_factory, folder) as out:
        done = out.with_name(f"{folder}.done")
        done.mkdir(parents=True, exist_ok=True)
        missing = []
        for run in runs:
            marker = done / run.partition(":")[0]
            if not marker.exists():
                missing.append(run)
            elif marker.read_text() != run:
                raise AssertionError(f"{folder}: {run!r} was recorded as {marker.read_text()!r}")
        if missing:
            record(script, out, *missing)
            for run in missing:
                (done / run.partition(":")[0]).write_text(run)
    return out


@dataclass
class Judged:
    """What ``precalign compare BASE CAND --report DIR`` gave."""

    exit_code: int
    output: str
    report: dict[str, Any] | None

    @property
    def training(self) -> dict[str, Any]:
        assert self.report is not None, self.output
        training = self.report.get("training")
        assert isinstance(training, dict), f"report.json has no training object:\n{self.output}"
        return training

    def verdict(self) -> tuple[int | None, str | None]:
        """(first divergent step, class): (None, None) when aligned."""
        return self.training["first_divergent_step"], self.training["first_divergent"]


def compare(base: Path, cand: Path, report: Path, *options: str) -> Judged:
    """The CLI's ``precalign compare`` in this process (its exit code and printed lines)."""
    from pytest_precalign.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["compare", str(base), str(cand), "--report", str(report), *options])
    file = report / "report.json"
    document = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None
    return Judged(code, out.getvalue() + err.getvalue(), document)


def env_diff(first: Path, second: Path) -> tuple[int, str]:
    """``precalign env-diff FIRST SECOND`` in this process: exit code and output."""
    from pytest_precalign.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["env-diff", str(first), str(second)])
    return code, out.getvalue()


def dump_suite(folder: Path, cases: dict[str, tuple[Path, Path, dict[str, Any] | None]]) -> Path:
    """An ``align.yaml`` of ``dump:`` cases (name -> baseline, candidate, expect) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["version: 1", "cases:"]
    for name, (base, cand, expect) in cases.items():
        lines += [
            f"  - name: {name}",
            f"    baseline: {{dump: {base}}}",
            f"    candidate: {{dump: {cand}}}",
        ]
        if expect is not None:
            lines.append(f"    expect: {json.dumps(expect)}")
    config = folder / "align.yaml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config


def run_dump_suite(config: Path, report: Path) -> subprocess.CompletedProcess[str]:
    """``pytest --align-config CONFIG --align-report REPORT`` in a subprocess, as CI would."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--align-config",
            str(config),
            "--align-report",
            str(report),
            "-q",
            str(config.parent),
        ],
        env=_env(),
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
