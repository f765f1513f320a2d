"""benchmarks/recorder_overhead.py judges a variant by per-round paired ratios (issue #25
item 13): a round where the machine was busy slows both runs of that round, not the ratio."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.helpers.paths import REPO

pytest.importorskip("transformers")


def overhead() -> Any:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import recorder_overhead
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return recorder_overhead


def results(bare: list[float], stats: list[float]) -> dict[str, list[Any]]:
    run = overhead().RunResult
    return {"none": [run(s) for s in bare], "stats": [run(s, records=1, kept_bytes=0) for s in stats]}


def test_the_ratio_is_the_median_of_paired_rounds() -> None:
    # Rounds 2 and 3 ran on a busy machine: both runs of the round slowed down together.
    keys = overhead().size_keys(results([1.0, 3.0, 3.0], [1.1, 3.3, 3.3]), {})
    assert keys["stats_ratio"] == pytest.approx(1.1)  # unpaired medians would say 3.3 / 3.0 = 1.1 too
    keys = overhead().size_keys(results([1.0, 1.0, 3.0], [1.1, 3.3, 3.3]), {})
    assert keys["stats_ratio"] == pytest.approx(1.1)  # unpaired: 3.3 / 1.0 = 3.3
    assert keys["stats_ratio_range"] == [pytest.approx(1.1), pytest.approx(3.3)]
    assert keys["noise"] == []


def test_a_ratio_under_one_is_flagged_as_noise() -> None:
    keys = overhead().size_keys(results([2.0, 2.0, 2.0], [1.4, 1.4, 2.2]), {})
    assert keys["stats_ratio"] == pytest.approx(0.7)
    assert keys["noise"] == ["stats"]


def test_rounds_change_every_variants_neighbour() -> None:
    """A rotation keeps each variant's predecessor (the bare run always after the disk
    variant): the rounds' orders must not."""
    bench = overhead()
    orders = [bench.round_order(r) for r in range(9)]  # mid's default: 2 warm-up + 7 rounds
    assert all(sorted(o) == sorted(bench.VARIANTS) for o in orders)
    for variant in bench.VARIANTS:
        before = {o[o.index(variant) - 1] for o in orders if o.index(variant) > 0}
        assert len(before) >= 2, variant


def test_training_overhead_times_only_the_recordings_own_calls() -> None:
    """``training_overhead.py`` reports the recording's own calls timed directly: the timer
    returns each call's value, passes its exception on, and counts only the calls it made."""
    import time

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import training_overhead
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    own = training_overhead.OwnTime()
    assert own(lambda x, *, y: x + y, 1, y=2) == 3
    before = own.seconds
    time.sleep(0.05)  # not through the timer: not counted
    assert own.seconds == before

    def fails() -> None:
        time.sleep(0.02)
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        own(fails)
    assert own.seconds >= before + 0.02
    assert set(own.parts) == {
        "test_training_overhead_times_only_the_recordings_own_calls.<locals>.<lambda>",
        "test_training_overhead_times_only_the_recordings_own_calls.<locals>.fails",
    }
    assert sum(own.parts.values()) == pytest.approx(own.seconds)
