"""Regenerate docs/report.png: run the example suite (its ``known_mlp_bug`` case has a
deliberate bug in layer 1's MLP), then photograph that case in report.html with headless
Chromium.

    python docs/make_screenshot.py            # needs /usr/bin/chromium and playwright
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = Path("example_suites") / "qwen2_hf_attention"
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
# and the backward table is folded (its chart stays).
TRIM = """
section.case[data-case="known_mlp_bug"] .table-wrap { max-height: 190px; }
section.case[data-case="known_mlp_bug"] .repro { display: none; }
"""


def main() -> int:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report"
        subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
             "--align-config", str(SUITE / "align.yaml"), str(SUITE), "--align-report", str(out)],
            cwd=REPO,
            check=True,
        )  # fmt: skip
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1180, "height": 900}, device_scale_factor=1)
            page.goto((out / "report.html").as_uri())
            page.add_style_tag(content=TRIM)
            case = page.locator('section.case[data-case="known_mlp_bug"]')
            case.locator('section.phase[data-phase="backward"] details').evaluate("d => d.open = false")
            target = REPO / "docs" / "report.png"
            case.screenshot(path=str(target))
            browser.close()
    print(f"wrote {target.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
