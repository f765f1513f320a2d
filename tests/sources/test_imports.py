"""A config's own module beats a same-named one imported earlier from another folder (two
suites with a ``faults.py`` each, in one pytest session)."""

from __future__ import annotations

import sys
from pathlib import Path

from pytest_precalign.sources.imports import import_object


def test_each_config_folder_gets_its_own_module_of_a_shared_name(tmp_path: Path) -> None:
    for suite, function in (("a", "scale_layer1"), ("b", "scale_first_mlp")):
        (tmp_path / suite).mkdir()
        (tmp_path / suite / "faults_shared.py").write_text(f"def {function}(model):\n    return '{suite}'\n")
    try:
        first = import_object("faults_shared:scale_layer1", tmp_path / "a", "a")
        second = import_object("faults_shared:scale_first_mlp", tmp_path / "b", "b")
        assert (first(None), second(None)) == ("a", "b")
        again = import_object("faults_shared:scale_layer1", tmp_path / "a", "a")
        assert again(None) == "a"
    finally:
        sys.modules.pop("faults_shared", None)
