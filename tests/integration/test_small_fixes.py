"""Issue #12 item 6, end to end (serially and with ``-n 2``): a named mapping file does not
take the config's place (test ids, report.json's ``config``, the reproduce command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.nets import write_mlp_suite
from tests.helpers.runs import RunPytest


def _suite_with_mapping_file(folder: Path) -> Path:
    """The MLP suite, buggy in block 1, whose case uses ``mapping: m`` from ``mappings: {m: m.yaml}``
    (a rename of each name to itself), listed before the cases."""
    config = write_mlp_suite(folder, bug="own")
    text = config.read_text(encoding="utf-8")
    text = text.replace("tolerances: tight}", "tolerances: tight, mapping: m}")
    text = text.replace("cases:\n", "mappings:\n  m: maps/m.yaml\ncases:\n", 1)
    config.write_text(text, encoding="utf-8")
    (folder / "maps").mkdir()
    (folder / "maps" / "m.yaml").write_text(
        "renames:\n  - {baseline: blocks.0, candidate: blocks.0}\n", encoding="utf-8"
    )
    return config


def test_named_mapping_file_keeps_the_configs_path(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    config = _suite_with_mapping_file(pytester.path)
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out", "-k", "forward")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert 'To reproduce: pytest --align-config align.yaml "align.yaml::port[forward]"' in text, text
    assert "m.yaml::" not in text
    report = json.loads((pytester.path / "out" / "report.json").read_text(encoding="utf-8"))
    assert report["config"] == str(config.resolve())
    assert [c["config"] for c in report["cases"]] == [str(config.resolve())]
    assert report["cases"][0]["first_divergence"]["name"] == "blocks.1"
