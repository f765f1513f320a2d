"""A gate that fails closed: a ``{dump:}`` case of an msprobe L0 dump (modules) against an L1
dump (APIs) of the same model pairs nothing, and fails with "nothing compared" -- under
pytest and in ``precalign compare`` (exit 1). The same dump
against itself passes, with its coverage in the summary line, report.json and JUnit XML."""

from __future__ import annotations

import json
import re
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from tests.helpers.paths import MSPROBE_DATA
from tests.helpers.runs import RunPytest

L0, L1 = MSPROBE_DATA / "tiny_statistics_L0", MSPROBE_DATA / "tiny_statistics_L1"


def _properties(junit: Path) -> dict[str, dict[str, str]]:
    root = ET.parse(junit).getroot()
    return {
        case.get("name", ""): {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        for case in root.iter("testcase")
    }


def test_an_l0_dump_against_an_l1_dump_fails_nothing_compared(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makefile(
        ".yaml",
        align=textwrap.dedent(
            f"""\
            version: 1
            cases:
              - name: levels
                baseline: {{dump: {L0}}}
                candidate: {{dump: {L1}}}
                phases: [forward, backward]
              - name: same
                baseline: {{dump: {L0}}}
                candidate: {{dump: {L0}}}
                phases: [forward]
            """
        ),
    )
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out", "--junitxml=out.xml")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "Nothing compared in forward: all 32 baseline forward output records found no partner" in out
    assert "the sides look like an L0 and an L1 dump (baseline: modules only, candidate: APIs only)" in out
    assert "FAILED levels[forward]: 0 compared, 108 unmatched; nothing compared: " in out
    assert "record both at the same level; coverage 0% (108 unexplained)" in out
    assert re.search(r"PASSED same\[forward\]: 103 compared; aligned; .*; coverage 100%\n", out)
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    coverage = {f"{c['name']}[{c['phase']}]": c["coverage"] for c in report["cases"]}
    assert coverage["levels[forward]"]["ratio"] == 0.0 and not coverage["levels[forward]"]["passed"]
    assert coverage["levels[forward]"]["baseline_outputs"] == 32
    assert coverage["same[forward]"]["ratio"] == 1.0 and coverage["same[forward]"]["floor"] == 0.5
    props = _properties(pytester.path / "out.xml")
    levels = next(p for name, p in props.items() if "levels" in name and "forward" in name)
    assert levels["precalign_coverage"] == "0.0" and levels["precalign_passed"] == "False"
    assert levels["precalign_coverage_problem"].startswith("nothing compared: ")
    same = next(p for name, p in props.items() if "same" in name)
    assert same["precalign_coverage"] == "1.0" and same["precalign_unexplained_unmatched"] == "0"


def test_precalign_compare_exits_1_when_nothing_was_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(L0), str(L1), "--report", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "FAILED tiny_statistics_L0_vs_tiny_statistics_L1[forward]: 0 compared, 108 unmatched" in out
    assert "nothing compared: all 32 baseline forward output records found no partner" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {c["phase"]: c["coverage"]["ratio"] for c in report["cases"]} == {"forward": 0.0, "backward": 0.0}
    assert "coverage problem" in (tmp_path / "out" / "report.html").read_text()
    assert main(["compare", str(L0), str(L0)]) == 0  # the same dump on both sides
