"""The module tree in report.html, in a real headless Chromium, for the example suites (the
in-process cases), the msprobe dump suite and a ``precalign compare`` of two msprobe dumps:
origin marked and open without a click, everything else collapsed, search, filters, phase
switch, a node's records, no network. One report per suite, made once per module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.cli import main
from tests.helpers.browser import Page
from tests.helpers.paths import EXAMPLES, REPO

SUITES = {
    "qwen2_hf_attention": ["-k", "known_mlp_bug"],
    "qwen2_5_megatron_vs_hf": ["-k", "known_megatron_mlp_bug and not isolated"],  # in process, no torchrun
    "msprobe_dumps": ["-k", "statistics_dumps or md5_dumps"],
}
DUMPS = EXAMPLES / "msprobe_dumps" / "dumps"


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """report folders: each example suite run once (serially, in a subprocess) and one
    ``precalign compare --report`` of the tensor dumps."""
    made = {}
    for suite, select in SUITES.items():
        out = tmp_path_factory.mktemp(suite) / "report"
        folder = EXAMPLES / suite
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rN",
             "--align-config", str(folder / "align.yaml"), str(folder), *select, "--align-report", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        made[suite] = out
    out = tmp_path_factory.mktemp("compare") / "report"
    base, pert = DUMPS / "base_micro_tensor_L0_statistics", DUMPS / "pert_micro_tensor_L0_statistics"
    assert main(["compare", str(base), str(pert), "--report", str(out)]) == 1
    made["msprobe_compare"] = out
    return made


def _paths(entries: list[dict[str, Any]]) -> set[str]:
    """Every tree path report.json implies: each record's dotted name and all its prefixes."""
    paths = set()
    for e in entries:
        names = [r["name"] for r in e["records"]]
        names += [u["name"] for side in ("baseline", "candidate") for u in e["unmatched"][side]]
        for name in names:
            parts = name.split(".")
            paths.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return paths


def _visible_paths(tree: Any, selector: str = "li[role=treeitem]") -> set[str]:
    items = tree.locator(selector)
    return {
        items.nth(i).get_attribute("data-path") or ""
        for i in range(items.count())
        if items.nth(i).is_visible()
    }


def _check_case(view: Page, name: str, entries: list[dict[str, Any]]) -> None:
    page = view.page
    tree = page.locator(f'section.tree-view[data-case="{name}"]')
    assert tree.locator("[role=tree]").count() == 1
    assert tree.locator("li[role=treeitem]").count() == len(_paths(entries) | {""})  # + the model's root
    origin = entries[0]["origin"]
    marked = tree.locator('li[role=treeitem][data-origin="true"]')
    assert marked.count() == 1 and marked.is_visible()  # without a click
    path = marked.get_attribute("data-path") or ""
    assert path == origin["module"]
    ancestors = {".".join(path.split(".")[:i]) for i in range(1, len(path.split(".")))}
    expanded = tree.locator('li[aria-expanded="true"]')
    opened = {expanded.nth(i).get_attribute("data-path") for i in range(expanded.count())}
    assert opened - {path} == ancestors | {""}  # the origin's path is open, nothing else
    assert _visible_paths(tree, 'li[role=treeitem][aria-level="2"]')  # the top level shows

    # the phase switch recolours the same tree: the origin is over its bound in its phase
    by_phase = {e["phase"]: e for e in entries}
    tree.locator(f'.phase-switch button[data-phase="{origin["phase"]}"]').click()
    assert marked.get_attribute("data-band") in ("over", "nonfinite")
    own = [r for e in entries for r in e["records"] if r["name"] == path]
    marked.locator(":scope > .node .name").click()
    assert tree.locator(".tree-detail tbody tr").count() == len(own) > 0
    assert path in tree.locator(".tree-detail h4").inner_text()

    # search: exactly the nodes whose name holds the text (and their ancestors) stay visible
    query = path.rsplit(".", 1)[-1]
    tree.locator(".tree-search").fill(query)
    hits = {p for p in _paths(entries) if query in p.lower()}
    cand = tree.locator("li.match")
    matched = {cand.nth(i).get_attribute("data-path") for i in range(cand.count())}
    assert hits <= matched and all(
        query in (p or "") or query in tree.locator(f'li[data-path="{p}"] > .node .cand').inner_text()
        for p in matched
    )
    assert all(tree.locator(f'li[data-path="{p}"]').is_visible() for p in hits)
    tree.locator(".tree-search").fill("")

    # filters, in each phase: "over tolerance" keeps exactly the nodes with a failing record
    for phase, entry in by_phase.items():
        tree.locator(f'.phase-switch button[data-phase="{phase}"]').click()
        assert tree.get_attribute("data-phase") == phase
        over = {r["name"] for r in entry["records"] if r["status"] != "ok"}
        box = tree.locator('.tree-filter[value="over"]')
        box.check()
        shown = tree.locator("li.match")
        got = {shown.nth(i).get_attribute("data-path") for i in range(shown.count())}
        assert got == over and (phase != origin["phase"] or path in got)
        assert all(shown.nth(i).is_visible() for i in range(shown.count()))
        box.uncheck()
        unmatched = {u["name"] for side in ("baseline", "candidate") for u in entry["unmatched"][side]}
        box = tree.locator('.tree-filter[value="unmatched"]')
        box.check()
        shown = tree.locator("li.match")
        assert {shown.nth(i).get_attribute("data-path") for i in range(shown.count())} == unmatched
        box.uncheck()
    assert tree.locator("li.hidden").count() == 0


@pytest.mark.parametrize("suite", [*SUITES, "msprobe_compare"])
def test_module_tree_in_report_html(reports: dict[str, Path], browser: Any, suite: str) -> None:
    out = reports[suite]
    document = json.loads((out / "report.json").read_text())
    cases: dict[str, list[dict[str, Any]]] = {}
    for entry in document["cases"]:
        cases.setdefault(entry["name"], []).append(entry)
    assert all(entries[0]["origin"] for entries in cases.values())  # each case has a known divergence
    view = Page(browser, out / "report.html")
    try:
        for name, entries in cases.items():
            _check_case(view, name, entries)
        if suite == "qwen2_5_megatron_vs_hf":  # the mapping renames: both names on the node
            node = view.page.locator('li[data-path="model.layers.1.mlp"]').first
            assert node.locator(":scope > .node .cand").inner_text() == "candidate: decoder.layers.1.mlp"
        assert view.errors == []
        assert all(url.startswith("file://") for url in view.requests), view.requests
    finally:
        view.close()
