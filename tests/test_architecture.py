"""The architecture's runtime half: the torch-free modules really load without torch.

The import-linter contracts in pyproject.toml (run by .ci/run's lint step) check the import
graph; they cannot tell a module-level import from one inside a function, so this imports each
torch-free module in a fresh interpreter and checks what got loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TORCH_FREE = (
    "pytest_precalign",
    "pytest_precalign.plugin",
    "pytest_precalign.cli",
    "pytest_precalign.vocabulary",
    "pytest_precalign._atomic",
    "pytest_precalign.trace.records",
    "pytest_precalign.trace.native_io",
    "pytest_precalign.trace.tensor_files",
    "pytest_precalign.msprobe.reader",
    "pytest_precalign.compare.pairs",
    "pytest_precalign.mapping.apply",
    "pytest_precalign.verdict.phase",
    "pytest_precalign.config.loader",
    "pytest_precalign.reports.text",
    "pytest_precalign.reports.document",
    "pytest_precalign.reports.html",
    "pytest_precalign.run.offline",
    "pytest_precalign.run.stored_runs",
)

PROBE = """
import importlib, json, sys
mods = sys.argv[1:]
for m in mods:
    importlib.import_module(m)
print(json.dumps(sorted(k for k in sys.modules if k == "torch" or k.startswith("torch."))))
"""


def test_torch_free_modules_load_without_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *TORCH_FREE], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize("module", ["pytest_precalign.run.case", "pytest_precalign.recording.recorder"])
def test_the_probe_sees_torch_where_it_is_imported(module: str) -> None:
    """The check above can fail: a torch-side module does load torch."""
    out = subprocess.run([sys.executable, "-c", PROBE, module], capture_output=True, text=True, check=True)
    assert "torch" in json.loads(out.stdout)
