"""Where the tests find the repository's files, wherever the test module sits."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
EXAMPLES = REPO / "example_suites"
PRESETS = SRC / "pytest_precalign" / "presets"
MSPROBE_DATA = REPO / "tests" / "data" / "msprobe"  # dumps made by msprobe itself
