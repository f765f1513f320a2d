"""The training run in report.html, rendered by a real headless Chromium: the verdict in
words, per-step curves of both sides, the first divergent step marked, and no layer origin
for a training-loop difference."""

from __future__ import annotations

from typing import Any

from tests.helpers.browser import Page


def entry(training: dict[str, Any]) -> dict[str, Any]:
    origin = {
        "module": "model.embed_tokens",
        "phase": "step",
        "step": 0,
        "evidence": "its grad matched",
        "proven": True,
    }
    return {
        "config": "a.yaml", "name": "warmup", "phase": "step", "passed": False, "verdict": "failed",
        "baseline": "hf", "candidate": "meg", "table": "t", "compared": 4, "failed": 4,
        "first_divergence": None, "worst": None, "records": [], "origin": origin, "training": training,
    }  # fmt: skip


def test_the_training_curves_mark_the_first_divergent_step(browser, tmp_path):
    from pytest_precalign.reports.document import report_document
    from pytest_precalign.reports.html import write_html_report

    steps = list(range(6))
    training = {
        "steps_compared": 6, "first_divergent_step": 1, "first_divergent": "schedule", "origin": "lr[0]",
        "evidence": "lr at step 1: 5.000e-04 vs 0.000e+00 (group 0)", "pattern": None,
        "downstream": "steps 2-5 are downstream of it", "lane": "approximate", "findings": [], "passed": False,
        "curves": {
            "steps": steps,
            "loss": {"baseline": [5.0, 4.9, 4.8, 4.7, 4.6, 4.5], "candidate": [5.0, 4.9, 4.85, 4.75, 4.65, 4.55]},
            "lr": {"baseline": [0, 5e-4, 1e-3, 1e-3, 1e-3, 1e-3], "candidate": [0, 0, 5e-4, 1e-3, 1e-3, 1e-3]},
        },
    }  # fmt: skip
    document = report_document([entry(training)], {"config": "a.yaml"})
    assert document["training"]["first_divergent_step"] == 1
    write_html_report(tmp_path, document)
    view = Page(browser, tmp_path / "report.html")
    try:
        page = view.page
        section = page.locator("div.training")
        assert section.get_attribute("data-first-step") == "1"
        assert "Step 1 diverged first: schedule, origin lr[0]" in section.inner_text()
        charts = page.locator("svg.training-chart")
        assert charts.evaluate_all("els => els.map(e => e.dataset.curve)") == ["loss", "lr", "loss_diff"]
        lr = page.locator('svg.training-chart[data-curve="lr"]')
        assert lr.locator("polyline.curve").evaluate_all("els => els.map(e => e.dataset.side)") == [
            "baseline",
            "candidate",
        ]
        assert lr.locator("polyline.candidate").get_attribute("points").count(",") == 6
        # the marker sits at step 1 of 0..5: a fifth of the plot width from its left edge
        box = lr.locator("rect.plot-bg")
        left, width = float(box.get_attribute("x")), float(box.get_attribute("width"))
        marker = float(lr.locator("line.first-step").get_attribute("x1"))
        assert abs(marker - (left + width / 5)) < 0.2
        assert lr.locator(".first-step-label").text_content() == "step 1"
        # the schedule, not a layer: no "Origin: model.embed_tokens" line
        assert page.locator("p.case-origin").count() == 0
        assert view.errors == []
    finally:
        view.close()
