"""report.html of a suite run (serially and merged from -n 2 workers), rendered by a real
headless Chromium: verdicts, first divergences, charts and sorting as a reader sees them."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browser import Page
from tests.helpers.report_suite import EXPECTED, load_report, make_suite
from tests.helpers.runs import RunPytest


def _run_suite(pytester: pytest.Pytester, run_pytest: RunPytest) -> Path:
    make_suite(pytester)
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out")
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


@pytest.mark.xdist_twin("report.html merged from the workers")
def test_report_html_shows_verdicts_first_divergence_charts_and_sorts(
    pytester: pytest.Pytester, run_pytest: RunPytest, browser: Any
) -> None:
    out = _run_suite(pytester, run_pytest)
    assert sorted(p.name for p in out.iterdir()) == [
        "compare_result.csv",
        "report.html",
        "report.json",
    ]  # no temp files
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
