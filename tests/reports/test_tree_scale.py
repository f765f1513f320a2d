"""A 7B-shaped report (28 layers x 12 modules, forward, backward and step): report.html stays a
few MB (records summarised, never tensors) and its module tree opens, searches, filters and
switches phase in Chromium. Sizes and times are benchmarks/report_tree_scale.py's, not asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.tree_document import LAYERS, MODULES, measure_tree


def test_7b_shaped_tree_stays_small_and_responsive(tmp_path: Path, browser: Any) -> None:
    measured = measure_tree(tmp_path, browser)  # checks each interaction's result
    assert measured["records"] > LAYERS * len(MODULES) * 3 and measured["html_bytes"] < 5_000_000
    assert measured["nodes"] > LAYERS * len(MODULES)
