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
    (
        "baseline",
        "align_baseline",
        "compare each case's candidate with a stored baseline DIR/<case>/ instead of a live baseline "
        "model (a missing one is written and the test fails)",
        {"metavar": "DIR"},
    ),
    (
        "update",
        "align_update",
        "with --align-baseline: rewrite the baselines that mismatch (the tests still fail)",
        {"action": "store_true"},
    ),
    (
        "update-all",
        "align_update_all",
        "with --align-baseline: rewrite every baseline run and pass",
        {"action": "store_true"},
    ),
)


def add_options(addoption: Callable[..., Any], prefix: str = "align-") -> None:
    for flag, dest, help_text, extra in OPTIONS:
        addoption(f"--{prefix}{flag}", dest=dest, default=None, help=help_text, **extra)
