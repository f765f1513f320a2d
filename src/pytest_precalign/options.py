"""Command-line options, shared by the pytest plugin (prefix ``align-``) and the CLI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# (flag without prefix, dest, help, extra argparse kwargs)
OPTIONS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("config", "align_config", "alignment config YAML: collect its cases as tests", {"metavar": "PATH"}),
    (
        "report",
        "align_report",
        "write report.json (one entry per case and phase) and report.html into DIR",
        {"metavar": "DIR"},
    ),
    (
        "save-traces",
        "align_save_traces",
        "save each case's baseline and candidate traces under DIR/<case>/ (never overwrites)",
        {"metavar": "DIR"},
    ),
)


def add_options(addoption: Callable[..., Any], prefix: str = "align-") -> None:
    for flag, dest, help_text, extra in OPTIONS:
        addoption(f"--{prefix}{flag}", dest=dest, default=None, help=help_text, **extra)
