"""report.html, rendered by a real headless Chromium: what a reader sees, not the HTML text."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from report_suite import EXPECTED, load_report, make_suite

CHROMIUM = Path("/usr/bin/chromium")
# Playwright adds --headless and a fresh temporary --user-data-dir itself.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: report.html is tested in a real browser. "
            "Install it with `apt-get install -y chromium` (.ci/run does)."
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield chromium
        chromium.close()


class Page:
    """A page that records every request and every script error."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.goto(path.as_uri())

    def close(self) -> None:
        self.page.close()


def _run_suite(pytester: pytest.Pytester) -> Path:
    make_suite(pytester)
    result = pytester.runpytest(
        "--align-config", "align.yaml", "--align-report", "out", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=4, failed=2)
    return pytester.path / "out"


def _tolerance_segments(d: str) -> list[tuple[float, float, float]]:
    """(x0, x1, y) for each horizontal step of the tolerance path."""
    coords = [(cmd, float(a), float(b)) for cmd, a, b in re.findall(r"([ML])([\d.]+),([\d.]+)", d)]
    segments = []
    for (_, x0, y0), (cmd, x1, y1) in pairwise(coords):
        if cmd == "L" and y0 == y1 and x1 > x0:
            segments.append((x0, x1, y0))
    return segments


def _tolerance_at(segments: list[tuple[float, float, float]], x: float) -> float:
    return next(y for x0, x1, y in segments if x0 <= x <= x1)


def test_report_html_shows_verdicts_first_divergence_charts_and_sorts(pytester, browser):
    out = _run_suite(pytester)
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json"]  # no temp files left
    report = load_report(out)
    entries = {f"{c['name']}[{c['phase']}]": c for c in report["cases"]}
    assert {k: v["verdict"] for k, v in entries.items()} == {k: v[1] for k, v in EXPECTED.items()}
    assert (
        "http://" not in (out / "report.html").read_text()
        and "https://" not in (out / "report.html").read_text()
    )

    view = Page(browser, out / "report.html")
    page = view.page
    try:
        assert page.locator("#summary").inner_text() == "6 items: 2 passed · 2 failed · 2 expected divergence"
        for name, verdict in (("clean", "passed"), ("broken", "failed"), ("known", "expected divergence")):
            case = page.locator(f'section.case[data-case="{name}"]')
            assert case.locator("h2 .badge").inner_text() == verdict
        broken_fwd = page.locator('section.case[data-case="broken"] section.phase[data-phase="forward"]')
        assert broken_fwd.locator(".first-name").inner_text() == "blocks.1"
        facts = broken_fwd.locator("dl.facts").inner_text()
        assert "origin" in facts and "worst metric" in facts
        assert entries["broken[forward]"]["first_divergence"]["name"] == "blocks.1"
        clean_fwd = page.locator('section.case[data-case="clean"] section.phase[data-phase="forward"]')
        assert "none: every record is within tolerance" in clean_fwd.locator("dl.facts").inner_text()

        for key, entry in entries.items():
            case, phase = key[:-1].split("[")
            section = page.locator(f'section.case[data-case="{case}"] section.phase[data-phase="{phase}"]')
            assert section.locator("h3 .badge").inner_text() == EXPECTED[key][1]
            chart = section.locator("svg.chart")
            assert chart.is_visible()
            box = chart.bounding_box()
            assert box is not None and box["width"] > 800 and box["height"] > 200
            records = entry["records"]
            # Every record here was compared tensor to tensor: each has an allclose check, so each
            # is one point, red exactly when it failed.
            assert all(any(c["metric"] == "allclose" for c in r["checks"]) for r in records)
            points = chart.locator(".point")
            assert points.count() == len(records) > 0
            failing = sum(r["status"] != "ok" for r in records)
            assert chart.locator(".point.fail").count() == failing == entry["failed"]
            assert (failing > 0) == (entry["verdict"] != "passed")
            # The tolerance step line: one step per record, failing points above it, passing
            # points on or below it (y grows downwards).
            segments = _tolerance_segments(chart.locator("path.tolerance").get_attribute("d"))
            assert len(segments) == len(records)
            for point in points.evaluate_all(
                "els => els.map(e => [e.getAttribute('class'), +e.getAttribute('cx'), +e.getAttribute('cy')])"
            ):
                cls, cx, cy = point
                limit = _tolerance_at(segments, cx)
                assert (cy < limit) if "fail" in cls else (cy >= limit), (key, point, limit)
            # A log axis: decade ticks, evenly spaced.
            ticks = chart.locator("text.tick.y").evaluate_all(
                "els => els.map(e => [e.textContent, +e.getAttribute('y')])"
            )
            exponents = [int(t[2:]) for t, _ in ticks]
            assert len(ticks) >= 3 and exponents == list(range(exponents[0], exponents[0] + len(exponents)))
            gaps = [b[1] - a[1] for a, b in pairwise(ticks)]
            assert max(gaps) - min(gaps) <= 0.2 and min(gaps) < 0  # 0.1 rounding in the SVG
            labels = chart.locator("text.axis-label").all_text_contents()
            assert any("execution order" in t for t in labels) and any(
                "|candidate − baseline|" in t for t in labels
            )
            if entry["first_divergence"]:
                assert (
                    chart.locator(".first-label").text_content().endswith(entry["first_divergence"]["name"])
                )

        # Sorting: click "value / allowed" (ascending, then descending), then "kind".
        table = broken_fwd.locator("table.records")
        header = table.locator("th", has_text="value / allowed")

        def column(index: int) -> list[str]:
            return table.locator(f"tbody tr td:nth-child({index})").evaluate_all(
                "els => els.map(e => e.dataset.sort)"
            )

        share_col = [t.strip() for t in table.locator("thead th").all_inner_texts()].index(
            "value / allowed"
        ) + 1
        before = column(1)
        assert [int(i) for i in before] == list(range(len(before)))  # execution order first
        header.click()
        assert header.get_attribute("aria-sort") == "ascending"
        shares = [float(v) for v in column(share_col)]
        assert shares == sorted(shares) and shares[0] < shares[-1]
        header.click()
        shares = [float(v) for v in column(share_col)]
        assert header.get_attribute("aria-sort") == "descending" and shares == sorted(shares, reverse=True)
        assert table.locator("tbody tr").first.get_attribute("class") == "fail"
        assert shares[0] == max(
            c["value"] / c["allowed"] for r in entries["broken[forward]"]["records"] for c in r["checks"]
        )
        kind = table.locator("th", has_text="kind")
        kind.click()
        kinds = column(3)
        assert kinds == sorted(kinds) and len(set(kinds)) > 1

        assert all(url.startswith("file://") for url in view.requests), view.requests
        assert view.errors == []
    finally:
        view.close()


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
        assert page.locator("script").count() == 1 and page.locator("img").count() == 0
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
