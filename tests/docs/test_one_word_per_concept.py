"""One word per concept (issue #33 item 6), kept true by reading the source: "contract" is the
check before step 0, never a first-divergence class. (report.json's sides are checked by
``tests/cli/test_compare.py``: baseline/candidate, never golden/target.)"""

from __future__ import annotations

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
