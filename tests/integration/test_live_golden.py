"""``record: {golden: PATH}`` in a case, end to end: the candidate is
compared with a golden run while it is recorded and keeps full tensors only where it is
beyond tolerance (plus its modules' inputs); the case still names the origin; a missing
golden is one usage error naming the path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.nets import MLP_CONFIG, write_mlp_suite
from tests.helpers.runs import RunPytest


def _with_golden(folder: Path, bug: str, golden: str) -> None:
    config = MLP_CONFIG.format(bug=bug, mode="stats").replace(
        "record: {mode: stats}", f"record: {{mode: stats, golden: {golden}}}"
    )
    assert golden in config
    (folder / "align.yaml").write_text(config, encoding="utf-8")


def _manifest(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return data


def test_case_with_golden_keeps_tensors_only_beyond_tolerance(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    # The golden run: the aligned case's baseline trace, saved.
    write_mlp_suite(pytester.path, bug="null", mode="stats")
    run_pytest("--align-config", "align.yaml", "--align-save-traces", "gold").assert_outcomes(passed=3)
    golden = pytester.path / "gold" / "align" / "port" / "baseline"
    assert (golden / "manifest.json").is_file()

    _with_golden(pytester.path, "null", "gold/align/port/baseline")
    result = run_pytest("--align-config", "align.yaml", "--align-save-traces", "aligned")
    result.assert_outcomes(passed=3)
    cand = pytester.path / "aligned" / "align" / "port" / "candidate"
    summary = _manifest(cand)["live"]
    assert summary["golden"] == str(golden.resolve())
    assert summary["compared"] == summary["records"] > 50
    assert summary["kept_tensors"] == 0 and summary["beyond"] == []
    assert "live" not in _manifest(pytester.path / "aligned" / "align" / "port" / "baseline")

    _with_golden(pytester.path, "between", "gold/align/port/baseline")
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out", "--align-save-traces", "bug")
    result.assert_outcomes(failed=3)
    origin = json.loads((pytester.path / "out" / "report.json").read_text())["cases"][0]["origin"]
    assert (origin["module"], origin["record"], origin["phase"]) == ("blocks.1", "blocks.1.up", "forward")
    cand = pytester.path / "bug" / "align" / "port" / "candidate"
    summary = _manifest(cand)["live"]
    assert "blocks.1.up|activation|out|0|0" in summary["beyond"]
    records = json.loads((cand / "index.json").read_text())["records"]
    kept = [r for r in records if r["tensor_key"]]
    assert 0 < summary["kept_tensors"] <= len(kept) < len(records)
    assert not [r for r in kept if r["name"].startswith("blocks.0") and r["phase"] == "forward"]


def test_missing_golden_is_a_usage_error(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    _with_golden(pytester.path, "null", "no_such_run")
    write_text = (pytester.path / "align.yaml").read_text()
    (pytester.path / "nets.py").write_text("", encoding="utf-8")
    assert "golden: no_such_run" in write_text
    result = run_pytest("--align-config", "align.yaml")
    text = "\n".join(result.outlines + result.errlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "Traceback" not in text
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, text
    assert "record.golden" in errors[0] and str(pytester.path / "no_such_run") in errors[0], errors
