"""Presets shipped with the package: mappings (``preset:NAME``) and msprobe layer_mapping files."""

from __future__ import annotations

from pathlib import Path

# The data folder stays at the package root (``presets/``, listed in pyproject's package-data).
PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"
