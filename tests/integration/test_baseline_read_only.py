"""A baseline folder mounted read-only (as CI often mounts shared baselines) serves for
comparing: no lock file is needed to read, a mismatch says the obtained trace could not be
written, and a case with no baseline there fails with one line saying the folder is read-only.

A real read-only bind mount: root on Linux only (else skipped, saying why)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.runs import RunPytest
from tests.integration.test_baseline import CONFIG, NETS


def _mount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True, capture_output=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        subprocess.run(["umount", str(folder)], check=False, capture_output=True)
        raise


@pytest.fixture
def read_only(pytester: pytest.Pytester) -> Iterator[Path]:
    """``bl`` in the pytester folder; the test writes a baseline there, then calls the returned
    folder's mount (a read-only bind mount of itself), undone at teardown."""
    if not sys.platform.startswith("linux"):
        pytest.skip("read-only bind mounts: Linux only")
    folder = pytester.path / "bl"
    folder.mkdir()
    probe = pytester.path / "probe"
    probe.mkdir()
    try:
        _mount_read_only(probe)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a read-only bind mount here (needs root and mount): {exc}")
    subprocess.run(["umount", str(probe)], check=True)
    yield folder
    subprocess.run(["umount", str(folder)], check=False, capture_output=True)


CASE = """
  - {{name: {name}, baseline: ref, candidate: {candidate}, inputs: toks, phases: [forward, backward],
     record: {{mode: tensor}}, tolerances: tight}}
"""


def _config(pytester: pytest.Pytester, *cases: tuple[str, str]) -> None:
    base = CONFIG.format(bug=0.0, extra="").replace(
        "  cand:", '  drifted: {source: factory, factory: "nets:build", kwargs: {bug: 0.01}}\n  cand:'
    )
    head = base[: base.index("  - {name: port")]
    pytester.makefile(".yaml", align=head + "".join(CASE.format(name=n, candidate=c) for n, c in cases))


def test_a_read_only_baseline_folder_is_usable_for_comparing(
    pytester: pytest.Pytester, run_pytest: RunPytest, read_only: Path
) -> None:
    pytester.makepyfile(nets=NETS)
    _config(pytester, ("port", "cand"), ("drift", "cand"))
    gate = ("--align-config", "align.yaml", "--align-baseline", "bl", "--align-report", "out")
    run_pytest(*gate).assert_outcomes(failed=4)  # "Baseline written": never accepted silently
    for lock in read_only.glob(".*.lock"):
        lock.unlink()  # a folder copied from elsewhere has no lock files
    before = sorted(p.relative_to(read_only).as_posix() for p in read_only.rglob("*"))
    _mount_read_only(read_only)

    # port: compared and aligned without a lock; drift: a mismatch, and why no obtained trace
    # was written; fresh: no baseline in the read-only folder, one line naming the folder.
    _config(pytester, ("port", "cand"), ("drift", "drifted"), ("fresh", "cand"))
    result = run_pytest(*gate)
    result.assert_outcomes(passed=2, failed=4)
    result.stdout.fnmatch_lines(["*Obtained trace not written: *bl is read-only*"])
    result.stdout.fnmatch_lines(["*bl: read-only; cannot write fresh there*"])
    assert "Traceback" not in result.stdout.str()
    entries = json.loads((pytester.path / "out" / "report.json").read_text())["cases"]
    # fresh has no verdict: its items failed with the error line above, which report.json keeps
    assert {(e["name"], e["passed"]) for e in entries} == {("port", True), ("drift", False), ("fresh", False)}
    assert {e["baseline"]["action"] for e in entries if e["name"] != "fresh"} == {"compared"}
    assert all("read-only; cannot write fresh there" in e["error"] for e in entries if e["name"] == "fresh")
    assert sorted(p.relative_to(read_only).as_posix() for p in read_only.rglob("*")) == before
