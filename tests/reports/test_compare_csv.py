"""compare_result.csv of ``precalign compare --report``: msprobe's own header for the same
dumps (the real ``msprobe compare`` writes it), one row per record pair, our columns after."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from tests.helpers.msprobe_cli import needs_msprobe
from tests.helpers.paths import EXAMPLES

DUMPS = EXAMPLES / "msprobe_dumps" / "dumps"
OURS = ["Accuracy Reached or Not", "case", "phase", "kind", "slot", "step", "status", "metric", "value",
        "allowed", "rule", "origin"]  # fmt: skip


def _msprobe_header(candidate: Path, golden: Path, out: Path) -> list[str]:
    """The header row of the compare_result_*.csv the real msprobe writes for two dumps."""
    import shutil
    import subprocess

    (cand,), (gold,) = candidate.rglob("dump.json"), golden.rglob("dump.json")
    out.mkdir()
    done = subprocess.run(
        [shutil.which("msprobe") or "msprobe", "compare", "-tp", str(cand), "-gp", str(gold), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (table,) = out.glob("compare_result_*.csv")
    with table.open(newline="") as f:
        return next(csv.reader(f))


@needs_msprobe
@pytest.mark.parametrize("dumps", ["tensor_L0_statistics", "statistics_L0_statistics", "statistics_L0_md5"])
def test_compare_result_csv_has_msprobes_header_and_one_row_per_pair(tmp_path: Path, dumps: str) -> None:
    base, pert = DUMPS / f"base_micro_{dumps}", DUMPS / f"pert_micro_{dumps}"
    assert main(["compare", str(base), str(pert), "--report", str(tmp_path / "out")]) == 1
    theirs = _msprobe_header(pert, base, tmp_path / "msprobe")
    with (tmp_path / "out" / "compare_result.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        header, rows = list(reader.fieldnames or []), list(reader)
    assert header == theirs + OURS
    assert {"NPU Name", "Bench Name", "NPU Dtype", "Bench Tensor Shape", "Result", "Err_message"} <= set(
        theirs
    )

    document = json.loads((tmp_path / "out" / "report.json").read_text())
    pairs = [(e["phase"], r["name"], r["slot"]) for e in document["cases"] for r in e["records"]]
    assert [(r["phase"], r["Bench Name"], r["slot"]) for r in rows] == pairs  # no unmatched here
    assert all(r["NPU Name"] == r["Bench Name"] for r in rows)  # the same model: no renames
    failed = [r for r in rows if r["Result"] != "pass"]
    assert failed and all(r["Accuracy Reached or Not"] == "No" and r["Err_message"] for r in failed)
    assert len(failed) == sum(e["failed"] for e in document["cases"])
    origin = [r for r in rows if r["origin"] == "origin"]
    assert [(r["phase"], r["Bench Name"]) for r in origin] == [("forward", "model.layers.0.mlp.down_proj")]
    assert origin[0]["Result"] == "error" and float(origin[0]["value"]) > float(origin[0]["allowed"])
    first = rows[0]
    assert first["Bench Dtype"] == "float32" and first["Bench Tensor Shape"].startswith("[")
    if dumps == "statistics_L0_md5":
        assert len(first["NPU MD5"]) == 8 and first["NPU MD5"] == first["BENCH MD5"]
    else:  # the statistics of both sides, as msprobe writes them
        assert float(first["NPU max"]) == pytest.approx(float(first["Bench max"]))
    if dumps == "statistics_L0_statistics":
        assert any(float(r["Max diff"]) != 0 for r in failed)
