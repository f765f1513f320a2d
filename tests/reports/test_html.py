"""report.html, rendered by a real headless Chromium: what a reader sees, not the HTML text."""

from __future__ import annotations

import math
from typing import Any

from tests.helpers.browser import Page


def test_report_html_escapes_names_and_marks_zero_and_off_scale_values(browser, tmp_path):
    from pytest_precalign.reports.document import report_document
    from pytest_precalign.reports.html import write_html_report

    hostile = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned=2">'

    def record(i: int, name: str, status: str, checks: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "seq": i, "name": name, "kind": "activation", "slot": "out", "step": 0, "call": 0,
            "status": status, "evidence": "tensor", "severity": 0.0, "atol": 1e-5, "rtol": 0.0, "checks": checks,
        }  # fmt: skip

    def allclose(value: float, allowed: float = 1e-5) -> dict[str, Any]:
        return {
            "metric": "allclose",
            "value": value,
            "allowed": allowed,
            "passed": value <= allowed,
            "upper": True,
        }

    records = [
        record(0, "embed", "ok", [allclose(0.0)]),
        record(1, hostile, "fail", [allclose(3e-3)]),
        record(2, "blocks.1", "fail", [allclose(math.nan)]),
        record(
            3,
            "blocks.2",
            "shape",
            [{"metric": "shape", "value": 8, "allowed": 4, "passed": False, "upper": True}],
        ),
        record(4, "head", "ok", [allclose(2e-6)]),
    ]
    first = {"name": hostile, "kind": "activation", "slot": "out", "step": 0, "call": 0, "metric": "allclose",
             "value": 3e-3, "allowed": 1e-5, "origin": False, "origin_module": hostile}  # fmt: skip
    entry = {
        "config": "a<b>.yaml", "name": "c<i>ase&amp;", "phase": "forward", "passed": False, "verdict": "failed",
        "baseline": "ref", "candidate": "<cand>", "table": "t", "compared": 5, "failed": 3,
        "first_divergence": first, "worst": None, "records": records,
        "environment": {"versions": {"torch": "<2.13>"}},
    }  # fmt: skip
    write_html_report(tmp_path, report_document([entry], {"config": "a<b>.yaml"}))

    view = Page(browser, tmp_path / "report.html")
    try:
        page = view.page
        assert page.evaluate("window.pwned") is None
        # one script runs; the module tree's data is a JSON block (its names escaped, see pwned)
        assert page.locator('script:not([type="application/json"])').count() == 1
        assert (
            page.locator('script[type="application/json"]').count() == 1 and page.locator("img").count() == 0
        )
        paths = page.locator("li[role=treeitem]").evaluate_all("items => items.map(li => li.dataset.path)")
        assert hostile in paths
        assert page.locator("section.case h2").inner_text().startswith("c<i>ase&amp;")
        assert page.locator(".first-name").inner_text() == hostile
        assert page.locator("table.records tbody tr").nth(1).locator("td").nth(1).inner_text() == hostile
        assert hostile in page.locator("svg.chart .first-label").text_content()
        assert "<2.13>" in page.locator("section.env").inner_text()
        chart = page.locator("svg.chart")
        assert chart.locator(".point").count() == 5
        assert chart.locator("circle.point.zero").count() == 1  # the exact zero, on the floor
        assert chart.locator("polygon.point.fail.off").count() == 2  # NaN and shape, on the top edge
        notes = page.locator("ul.notes").inner_text()
        assert "1 exact zero(s)" in notes and "2 failing record(s) not on this axis" in notes
        floor = max(
            float(c)
            for c in chart.locator("circle.point").evaluate_all("els => els.map(e => e.getAttribute('cy'))")
        )
        assert floor == float(chart.locator("circle.point.zero").get_attribute("cy"))
        assert view.errors == []
    finally:
        view.close()


def test_hash_evidence_is_drawn_as_a_match_strip(browser, tmp_path):
    from pytest_precalign.reports.document import report_document
    from pytest_precalign.reports.html import write_html_report

    def record(i: int, same: bool) -> dict[str, Any]:
        check = {
            "metric": "crc32",
            "value": 0.0 if same else 1.0,
            "allowed": 0.0,
            "passed": same,
            "upper": True,
        }
        return {"seq": i, "name": f"layers.{i}", "kind": "activation", "slot": "out", "step": 0, "call": 0,
                "status": "ok" if same else "fail", "evidence": "hash", "atol": 0.0, "rtol": 0.0, "checks": [check]}  # fmt: skip

    records = [record(i, i < 3) for i in range(5)]
    first = {"name": "layers.3", "kind": "activation", "slot": "out", "step": 0, "call": 0, "metric": "crc32",
             "value": 1.0, "allowed": 0.0, "origin": True, "origin_module": "layers.3"}  # fmt: skip
    entry = {"config": "a.yaml", "name": "md5", "phase": "forward", "passed": False, "verdict": "failed",
             "compared": 5, "failed": 2, "first_divergence": first, "records": records}  # fmt: skip
    write_html_report(tmp_path, report_document([entry], {}))
    view = Page(browser, tmp_path / "report.html")
    try:
        chart = view.page.locator("svg.chart.strip")
        assert chart.locator(".point").count() == 5 and chart.locator(".point.fail").count() == 2
        cx = [
            float(v)
            for v in chart.locator(".point").evaluate_all("els => els.map(e => e.getAttribute('cx'))")
        ]
        assert cx == sorted(cx)  # execution order, left to right
        assert chart.locator(".first-label").text_content() == "first divergence: layers.3"
        assert view.page.locator("figure").get_attribute("data-points") == "5"
        assert "match vs depth" in view.page.locator("figcaption").inner_text()
        assert view.errors == []
    finally:
        view.close()
