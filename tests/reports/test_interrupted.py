"""An interrupted run is reported as interrupted, never as a pass (issue #25, item 5): pytest
stopped by KeyboardInterrupt (exit 2) after one case phase of three."""

from __future__ import annotations

import json

import pytest

from tests.helpers.nets import write_mlp_suite

INTERRUPT_AFTER_FIRST = """
def pytest_runtest_teardown(item):
    raise KeyboardInterrupt  # as a Ctrl-C after the first item
"""


def test_an_interrupted_run_writes_an_interrupted_report(pytester: pytest.Pytester) -> None:
    write_mlp_suite(pytester.path)
    pytester.makeconftest(INTERRUPT_AFTER_FIRST)
    result = pytester.runpytest_subprocess("--align-config", "align.yaml", "--align-report", "out")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    data = json.loads((pytester.path / "out" / "report.json").read_text())
    assert data["interrupted"] is True
    assert (data["collected"], len(data["cases"])) == (3, 1)
    html = (pytester.path / "out" / "report.html").read_text()
    header = html.split("<header>", 1)[1].split("</header>", 1)[0]
    assert 'class="badge fail">interrupted<' in header and "badge pass" not in header
    assert "interrupted: 1 of 3 collected items ran" in header


def test_a_complete_run_is_not_marked_interrupted(pytester: pytest.Pytester) -> None:
    write_mlp_suite(pytester.path)
    result = pytester.runpytest_subprocess("--align-config", "align.yaml", "--align-report", "out")
    assert result.ret == pytest.ExitCode.OK
    data = json.loads((pytester.path / "out" / "report.json").read_text())
    assert data["interrupted"] is False and data["collected"] == 3
    assert "interrupted" not in (pytester.path / "out" / "report.html").read_text().split("</header>")[0]
