"""One word per concept (issue #33 item 6), kept true by reading the source: "contract" is the
check before step 0, never a first-divergence class. (report.json's sides are checked by
``tests/cli/test_compare.py``: baseline/candidate, never golden/target.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pytest_precalign.verdict.training_run import PHASE_OF_CLASS
from pytest_precalign.vocabulary import TRAINING_CLASSES

SRC = Path(__file__).resolve().parents[2] / "src" / "pytest_precalign"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}


def test_contract_is_the_check_before_step_0_not_a_class() -> None:
    assert "settings" in TRAINING_CLASSES and "contract" not in TRAINING_CLASSES
    assert set(PHASE_OF_CLASS) == set(TRAINING_CLASSES)
    # No "contract" string literal stands for a class anywhere (the one left refuses it in a config).
    found = {name for name, text in _sources().items() if re.search(r"""["']contract["']""", text)}
    assert found == {"config/cases.py"}


ROOT = SRC.parents[1]
# The default record mode and its one exception, told once, in the Python API's reference (the
# defaults themselves are read from the signatures below, not from prose).
DEFAULT_MODE = (
    "Every recorder defaults to stats; PrecalignCallback alone defaults to scalars (per-step "
    "scalars only, no hooks: cheap enough to leave on for a whole run)."
)
TOLD_IN = ("docs/reference/python_api.md",)


def _flat(text: str) -> str:
    """Text without markup (backticks, comment marks) and line breaks."""
    return " ".join(text.replace("`", "").replace("#", " ").split())


def test_the_default_record_mode_and_its_exception_are_told_where_defaults_are() -> None:
    import inspect

    from pytest_precalign import AccelerateSteps, PrecalignCallback, PrecalignLightningCallback, Recorder
    from pytest_precalign.config.specs import RecordSpec
    from pytest_precalign.recording import HookRecorder

    recorders = (Recorder, HookRecorder, PrecalignLightningCallback, AccelerateSteps, PrecalignCallback)
    defaults = {r.__name__: inspect.signature(r).parameters["mode"].default for r in recorders}
    assert defaults == {
        "Recorder": "stats",
        "HookRecorder": "stats",
        "PrecalignLightningCallback": "stats",
        "AccelerateSteps": "stats",
        "PrecalignCallback": "scalars",
    }
    assert RecordSpec().mode == "stats"
    untold = [p for p in TOLD_IN if DEFAULT_MODE not in _flat((ROOT / p).read_text(encoding="utf-8"))]
    assert untold == []


def test_replay_is_only_the_step_replay() -> None:
    """The optimizer's per-update check is the update check and isolation is isolation: a module
    named a replay is about the step replay (the first divergent step re-run from the
    baseline's state), and no line elsewhere calls anything else one."""
    sources = _sources()
    replay_modules = {name for name in sources if "replay" in name}
    assert replay_modules, "the step replay's modules are named so"
    for name in replay_modules:
        face = " ".join((ast.get_docstring(ast.parse(sources[name])) or "").split())
        assert "first divergent step" in face, name
    other = [
        f"{name}: {line.strip()}"
        for name, text in sources.items()
        if name not in replay_modules
        for line in text.splitlines()
        if "replay" in line.lower() and re.search(r"optimi|update|isolat|per-module", line, re.I)
    ]
    assert other == []
