"""Mapping and tolerance files, end to end: a named mapping file does not take the config's
place (test ids, report.json's ``config``, the reproduce command); the align marker and
``align_runner`` take mapping and tolerance files relative to the test file."""

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


RENAMED = """
import pytest
import torch
import nets


class Renamed(torch.nn.Module):
    # nets.Net with blocks -> layers and head -> lm_head
    def __init__(self, net):
        super().__init__()
        self.embed, self.layers, self.lm_head = net.embed, net.blocks, net.head

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def _pair():
    torch.manual_seed(0)
    a = nets.Net()
    torch.manual_seed(0)
    return a, Renamed(nets.Net()), torch.randint(0, 50, (2, 5))


def test_mapping_path(align_runner):
    a, b, ids = _pair()
    run = align_runner.check(a, b, {"input_ids": ids}, mapping="maps/m.yaml")
    assert not run.verdicts["forward"].only_candidate


@pytest.mark.align(mapping="maps/m.yaml")
def test_mapping_marker(align_runner):
    a, b, ids = _pair()
    run = align_runner.check(a, b, {"input_ids": ids})
    assert not run.verdicts["forward"].only_candidate


def test_without_mapping_names_differ(align_runner):
    a, b, ids = _pair()
    run = align_runner.compare(a, b, {"input_ids": ids})
    assert {r.name for r in run.verdicts["forward"].only_candidate} >= {"layers.0", "lm_head"}


@pytest.mark.align(tolerances="tol/fp32.yaml")
def test_tolerance_file(align_runner):
    assert [r.why for r in align_runner.tolerances.rules] == ["from the file"]
    assert align_runner.tolerances.rules[0].atol == 1e-5
"""


def test_align_runner_mapping_and_tolerance_file(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    write_mlp_suite(pytester.path)
    (pytester.path / "maps").mkdir()
    (pytester.path / "maps" / "m.yaml").write_text(
        "renames:\n  - {baseline: blocks, candidate: layers}\n  - {baseline: head, candidate: lm_head}\n",
        encoding="utf-8",
    )
    (pytester.path / "tol").mkdir()
    (pytester.path / "tol" / "fp32.yaml").write_text(
        'rules:\n  - {match: "*", atol: 1e-5, rtol: 0, why: "from the file"}\n', encoding="utf-8"
    )
    pytester.makepyfile(test_renamed=RENAMED)
    result = run_pytest("test_renamed.py")
    result.assert_outcomes(passed=4)
