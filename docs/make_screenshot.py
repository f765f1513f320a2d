"""Regenerate docs/report.png: run the example suite (its ``known_mlp_bug`` case has a
deliberate bug in layer 1's MLP), then photograph that case in report.html with headless
Chromium. Then the module tree of one case per example suite and of a ``precalign compare``
of two msprobe dumps, with the origin's records open: docs/tree_<suite>.png. Then the per-step
curves of example_suites/training's ``layer_bug_from_step_5`` case (the candidate's
model.layers.1.mlp scales its output by 1.01 from update 5, found at step 5):
docs/training_curves.png, shown by that suite's README.

    python docs/make_screenshot.py            # needs /usr/bin/chromium and playwright
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SUITE = Path("example_suites") / "qwen2_hf_attention"
# picture -> (suite, pytest selection, the case whose tree is shown); the in-process cases only
TREES = {
    "qwen2_hf_attention": ("qwen2_hf_attention", "known_mlp_bug", "known_mlp_bug"),
    "qwen2_5_megatron_vs_hf": (
        "qwen2_5_megatron_vs_hf",
        "known_megatron_mlp_bug and not isolated",
        "known_megatron_mlp_bug",
    ),
    "msprobe_dumps": ("msprobe_dumps", "statistics_dumps", "statistics_dumps"),
}
DUMPS = Path("example_suites") / "msprobe_dumps" / "dumps"
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Keep the picture to what a reader looks at first: the tables are shown a few rows deep,
# and the backward table is folded (its chart stays); the module tree has its own pictures.
TRIM = """
section.case[data-case="known_mlp_bug"] .table-wrap { max-height: 190px; }
section.case[data-case="known_mlp_bug"] .repro { display: none; }
section.case[data-case="known_mlp_bug"] section.tree-view { display: none; }
"""


def run_suite(suite: Path, out: Path, select: str | None = None) -> None:
    """The suite's items (``-k select``), serially, with --align-report ``out``."""
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "--align-config", str(suite / "align.yaml"), str(suite), "--align-report", str(out),
         *(["-k", select] if select else [])],
        cwd=REPO,
        check=True,
    )  # fmt: skip


def shoot_tree(browser: Any, report: Path, case: str, target: Path) -> None:
    """The case's module tree as loaded (origin open and marked), its origin's records shown."""
    page = browser.new_page(viewport={"width": 1180, "height": 900}, device_scale_factor=1)
    page.goto(report.as_uri())
    page.add_style_tag(content="ul.tree, .tree-detail { max-height: 430px; }")
    tree = page.locator(f'section.tree-view[data-case="{case}"]')
    origin = tree.locator('li[data-origin="true"] > .node .name')
    origin.click()
    origin.scroll_into_view_if_needed()
    tree.screenshot(path=str(target))
    page.close()
    print(f"wrote {target.relative_to(REPO)}")


def trees(browser: Any, tmp: Path) -> None:
    for picture, (suite, select, case) in TREES.items():
        out = tmp / picture
        run_suite(Path("example_suites") / suite, out, select)
        shoot_tree(browser, out / "report.html", case, REPO / "docs" / f"tree_{picture}.png")
    out = tmp / "compare"
    base, pert = DUMPS / "base_micro_tensor_L0_statistics", DUMPS / "pert_micro_tensor_L0_statistics"
    subprocess.run(
        [sys.executable, "-m", "pytest_precalign", "compare", str(base), str(pert), "--report", str(out)],
        cwd=REPO,
    )  # exits 1: the perturbed weight is found
    case = f"{base.name}_vs_{pert.name}"
    shoot_tree(browser, out / "report.html", case, REPO / "docs" / "tree_msprobe_compare.png")


def training_curves(browser: Any, tmp: Path) -> None:
    """The loss / LR / grad-norm curves of both sides of a 10-step run, the first divergent step
    marked."""
    out = tmp / "training"
    run_suite(Path("example_suites") / "training", out, "layer_bug_from_step_5")
    page = browser.new_page(viewport={"width": 1180, "height": 900}, device_scale_factor=1)
    page.goto((out / "report.html").as_uri())
    target = REPO / "docs" / "training_curves.png"
    page.locator('section.case[data-case="layer_bug_from_step_5"] div.training').first.screenshot(
        path=str(target)
    )
    page.close()
    print(f"wrote {target.relative_to(REPO)}")


def main() -> int:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report"
        run_suite(SUITE, out)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1180, "height": 900}, device_scale_factor=1)
            page.goto((out / "report.html").as_uri())
            page.add_style_tag(content=TRIM)
            case = page.locator('section.case[data-case="known_mlp_bug"]')
            case.locator('section.phase[data-phase="backward"] details').evaluate("d => d.open = false")
            target = REPO / "docs" / "report.png"
            case.screenshot(path=str(target))
            trees(browser, Path(tmp))
            training_curves(browser, Path(tmp))
            browser.close()
    print(f"wrote {target.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
