"""The architecture's runtime half: the torch-free modules really load without torch.

The import-linter contracts in pyproject.toml (run by .ci/run's lint step) check the import
graph; they cannot tell a module-level import from one inside a function, so this imports each
torch-free module in a fresh interpreter and checks what got loaded."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TORCH_FREE = (
    "pytest_precalign",
    "pytest_precalign.plugin",
    "pytest_precalign.cli",
    "pytest_precalign.vocabulary",
    "pytest_precalign._atomic",
    "pytest_precalign.untrusted",
    "pytest_precalign.redaction",
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
    "pytest_precalign.run.devices",
    "pytest_precalign.steps.trainer_registry",
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


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# A class is held to half a module: one over it carries more than one concern, which the module
# cap alone let grow (``HookRecorder`` and ``Recorder`` were 525 and 491 lines, each most of its
# module, before they were split along their seams: the capture core, the hooks torch calls and
# the parameter records; the loop, the step's evidence and its writes). Mixins declare the
# attributes they use, and each is counted on its own.
MAX_CLASS_LINES = 300


def _package_files() -> list[Any]:
    import pytest_precalign

    root = Path(pytest_precalign.__file__).parent
    return sorted(root.rglob("*.py"))


def test_no_module_over_600_lines() -> None:
    long = {str(p): n for p in _package_files() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def _over(kinds: tuple[type[ast.AST], ...], cap: int) -> dict[str, int]:
    """The package's definitions of ``kinds`` longer than ``cap`` lines: "file:line name" -> lines."""
    long = {}
    for path in _package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kinds):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > cap:
                    long[f"{path.name}:{node.lineno} {getattr(node, 'name', '')}"] = lines
    return long


def test_no_function_over_60_lines() -> None:
    assert _over((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES) == {}


def test_no_class_over_300_lines() -> None:
    assert _over((ast.ClassDef,), MAX_CLASS_LINES) == {}
