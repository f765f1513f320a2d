"""A module path thousands of segments deep (a generated model, a foreign dump's names) is
one node per segment in report.html's tree: built without recursion (no RecursionError), and
drawn by the page without recursion either."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.reports.document import write_reports
from pytest_precalign.reports.tree import case_tree

DEPTH = 2000


def _entry(name: str, value: float = 0.1) -> dict[str, Any]:
    check = {"metric": "allclose", "value": value, "allowed": 1.0, "passed": value <= 1.0, "upper": True}
    record = {"name": name, "kind": "activation", "slot": "out", "step": 0,
              "status": "ok" if value <= 1.0 else "fail", "checks": [check]}  # fmt: skip
    return {"phase": "forward", "records": [record], "unmatched": {"baseline": [], "candidate": []},
            "nonfinite": [], "case": "deep", "nodeid": "deep[forward]"}  # fmt: skip


def _deep(depth: int) -> str:
    return ".".join(f"m{i}" for i in range(depth))


@pytest.mark.parametrize("depth", [DEPTH, 3 * sys.getrecursionlimit()])
def test_a_deep_module_path_builds_its_tree(depth: int) -> None:
    tree = case_tree([_entry(_deep(depth), value=3.0)])
    assert len(tree["nodes"]) == depth + 1  # the root and one node per segment
    deepest = tree["nodes"][-1]
    assert deepest[1] == _deep(depth) and deepest[3] == depth - 1
    assert tree["bands"][tree["nodes"][0][5]["forward"]] == "over"  # spread up to the root


def test_a_deep_module_path_writes_the_whole_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    write_reports(out, [_entry(_deep(DEPTH))], {"baseline": "a", "candidate": "b"})
    assert json.loads((out / "report.json").read_text())["cases"][0]["records"][0]["name"] == _deep(DEPTH)
    html = (out / "report.html").read_text()
    assert "m1999" in html and (out / "compare_result.csv").is_file()


def test_a_deep_tree_opens_in_chromium(tmp_path: Path, browser: Any) -> None:
    out = tmp_path / "report"
    write_reports(out, [_entry(_deep(DEPTH), value=3.0)], {"baseline": "a", "candidate": "b"})
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((out / "report.html").as_uri())
    assert page.locator("section.tree-view li[role=treeitem]").count() == DEPTH + 1
    assert errors == []


@pytest.mark.slow
def test_a_6000_deep_tree_is_drawn_without_a_stack_overflow(tmp_path: Path, browser: Any) -> None:
    """Drawn recursively, a 6,000-deep tree overflowed Chromium's JS stack ("Maximum call stack
    size exceeded", no tree at all); drawn with a loop, every node is there (slow: the page's
    layout of 6,000 nested lists takes a while)."""
    depth = 6000
    out = tmp_path / "report"
    write_reports(out, [_entry(_deep(depth), value=3.0)], {"baseline": "a", "candidate": "b"})
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((out / "report.html").as_uri(), timeout=600_000)
    assert errors == []
    assert page.locator("section.tree-view li[role=treeitem]").count() == depth + 1
