"""The serial inner pytest runs in this process (``run_pytest``): a module another test imported
earlier from its own folder (a suite's ``nets.py``, kept by an in-process ``precalign`` call)
must not stand in for the test's own file of the same name."""

from __future__ import annotations

import sys
import types

import pytest

from tests.helpers.runs import RunPytest


def test_a_same_named_module_imported_earlier_is_not_the_tests_own(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "nets.py"
    elsewhere.write_text("OTHER = 1\n")
    earlier = types.ModuleType("nets")
    earlier.__file__ = str(elsewhere)
    monkeypatch.setitem(sys.modules, "nets", earlier)
    pytester.makepyfile(nets="OWN = 2\n")
    pytester.makepyfile(test_own="import nets\n\ndef test_own():\n    assert nets.OWN == 2\n")
    run_pytest().assert_outcomes(passed=1)
