"""Outcomes as data (run/outcome.py): the once-per-case bookkeeping, the compare threads
setting, and item outcomes of the stored-baseline gate. No models, no pytest session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_precalign.baseline.gate import baseline_outcome, update_policy
from pytest_precalign.baseline.store import BaselineOutcome
from pytest_precalign.compare.workers import busy_now, compare_workers, free_cores
from pytest_precalign.config.specs import CaseSpec, Models, OptimizerSpec, RecordSpec, TrainingSpec
from pytest_precalign.errors import ConfigError, TraceError
from pytest_precalign.run.outcome import PerCase


def test_per_case_computes_once_and_frees_after_the_last_use() -> None:
    runs: PerCase[str] = PerCase()
    calls: list[str] = []

    def compute() -> str:
        calls.append("run")
        return "result"

    assert [runs.take("case", 3, compute) for _ in range(3)] == ["result"] * 3
    assert calls == ["run"] and len(runs) == 0  # freed after its third (last) phase item
    runs.take("case", 1, compute)
    assert calls == ["run", "run"]


def test_per_case_raises_a_usage_error_for_every_phase_item() -> None:
    runs: PerCase[str] = PerCase()
    calls = 0

    def broken() -> str:
        nonlocal calls
        calls += 1
        raise TraceError("no such dump")

    for _ in range(2):
        with pytest.raises(TraceError, match="no such dump"):
            runs.take("case", 2, broken)
    assert calls == 1 and len(runs) == 0


def test_per_case_lets_other_errors_through() -> None:
    runs: PerCase[str] = PerCase()
    with pytest.raises(ZeroDivisionError):
        runs.take("case", 2, lambda: str(1 / 0))


@pytest.mark.parametrize(("value", "expected"), [("3", 3), (" 1 ", 1)])
def test_compare_workers_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: int
) -> None:
    monkeypatch.setenv("PRECALIGN_COMPARE_THREADS", value)
    assert compare_workers() == expected


@pytest.mark.parametrize(
    ("cores", "load", "expected"),
    [(2, 0.0, 2), (2, 0.4, 2), (2, 1.03, 1), (2, 1.6, 1), (2, 5.5, 1), (8, 0.2, 4), (8, 5.2, 3), (1, 0.0, 1)],
)
def test_compare_threads_default_to_the_free_cores(cores: int, load: float, expected: int) -> None:
    assert free_cores(cores, load) == expected


def test_compare_threads_without_the_variable_follow_the_busy_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRECALIGN_COMPARE_THREADS", raising=False)
    monkeypatch.setattr("pytest_precalign.compare.workers.busy_now", lambda: 64.0)
    assert compare_workers() == 1
    monkeypatch.setattr("pytest_precalign.compare.workers.busy_now", lambda: 0.0)
    assert compare_workers() == max(1, min(4, len(os.sched_getaffinity(0))))


def test_busy_now_counts_the_other_running_tasks(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/loadavg's running tasks, this one excluded; the 1-minute load average (which lags
    behind a burst that just ended) only without it."""
    monkeypatch.setattr("os.getloadavg", lambda: (5.0, 0.0, 0.0))
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("7.80 8.70 6.20 3/79 17851\n")
    assert busy_now(loadavg=str(loadavg)) == 2.0
    loadavg.write_text("7.80 8.70 6.20 1/79 17851\n")
    assert busy_now(loadavg=str(loadavg)) == 0.0  # idle now, although the averages say 7.8
    for text in ("", "7.80 8.70", "a b c d/e f"):
        loadavg.write_text(text)
        assert busy_now(loadavg=str(loadavg)) == 5.0
    assert busy_now(loadavg=str(tmp_path / "missing")) == 5.0
    if Path("/proc/loadavg").exists():
        assert 0.0 <= busy_now() < 1000


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_compare_threads_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("PRECALIGN_COMPARE_THREADS", value)
    with pytest.raises(
        ConfigError, match=f"PRECALIGN_COMPARE_THREADS={value!r}: expected a whole number >= 1"
    ):
        compare_workers()


def test_update_policy() -> None:
    assert update_policy(False, False) == "none"
    assert update_policy(True, False) == "mismatched"
    assert update_policy(False, True) == update_policy(True, True) == "all"


def _case() -> CaseSpec:
    return CaseSpec(
        name="port", sides=Models("ref", "cand"), inputs="toks", phases=("forward", "backward"),
        steps=1, sync_weights=False, strict_weights=True, mapping=None,
        training=TrainingSpec(OptimizerSpec(), loss="none", train=False),
        record=RecordSpec(), tolerances=None, expect=None, where="align.yaml",
    )  # fmt: skip


@pytest.mark.parametrize("action", ["written", "written-earlier"])
def test_a_written_baseline_is_a_failing_outcome_with_a_report_entry(tmp_path: Path, action: str) -> None:
    outcome = BaselineOutcome("port", tmp_path / "bl" / "port", action, weights_source="as built (seed)")
    item = baseline_outcome(
        outcome, _case(), "backward", "align.yaml::port[backward]",
        config_path=tmp_path / "align.yaml", rel="align.yaml", root="bl",
    )  # fmt: skip
    assert item.name == "port[backward]" and not item.passed
    assert item.summary == f"FAILED port[backward]: baseline {action}: {tmp_path / 'bl' / 'port'}"
    assert item.entry is not None and item.entry["nodeid"] == "align.yaml::port[backward]"
    assert item.entry["passed"] is False and item.entry["baseline"]["action"] == action
    assert item.properties == (("precalign_baseline", action),)
    assert str(tmp_path / "bl" / "port") in item.message
