"""``PRECALIGN_RANK_WAIT``: the seconds a rank of a sharded model waits for the others at
``Recorder.start`` (``steps/rank_agreement.py``; the wait itself under torchrun in
``test_sharded_runs.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


@pytest.mark.parametrize("said", ["0", "-3", "soon", "inf", "nan"])
def test_a_wait_that_is_not_a_number_of_seconds_is_refused(
    monkeypatch: pytest.MonkeyPatch, said: str
) -> None:
    from pytest_precalign.errors import ConfigError
    from pytest_precalign.steps.rank_agreement import wait_seconds

    monkeypatch.setenv("PRECALIGN_RANK_WAIT", said)
    with pytest.raises(ConfigError, match=f"PRECALIGN_RANK_WAIT={said!r}: expected a number of seconds > 0"):
        wait_seconds()


def test_the_wait_is_600_s_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_precalign.steps.rank_agreement import wait_seconds

    monkeypatch.delenv("PRECALIGN_RANK_WAIT", raising=False)
    assert wait_seconds() == 600.0
    monkeypatch.setenv("PRECALIGN_RANK_WAIT", " 2.5 ")
    assert wait_seconds() == 2.5
