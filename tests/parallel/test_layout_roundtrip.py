"""One ``parallel`` layout, one validator: what the Recorder writes, ``precalign compare`` reads.

Real recordings: a small torch model recorded on each rank of an explicit layout, written as
``step0/rank<R>/`` folders, then merged and compared by the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.cli import main
from pytest_precalign.errors import ConfigError, TraceError
from pytest_precalign.parallel.layout import check_layout_block, layout_from_manifest

torch = pytest.importorskip("torch")


def record(root: Path, layout: dict[str, Any], world: int) -> None:
    from pytest_precalign import Recorder

    for rank in range(world):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
        with Recorder(root, mode="tensor", layout={**layout, "rank": rank}).recording(model):
            model(torch.ones(2, 4)).sum().backward()


@pytest.mark.parametrize(
    ("layout", "world"),
    [
        ({"tp": 2}, 2),
        ({"dp": 2}, 2),
        ({"dp": 2, "order": "tp-cp-ep-pp-dp"}, 2),
        ({"tp": 2, "dp": 2, "world_size": 4}, 4),
    ],
)
def test_a_layout_that_records_also_compares(tmp_path: Path, layout: dict[str, Any], world: int) -> None:
    record(tmp_path / "a", layout, world)
    record(tmp_path / "b", layout, world)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"tp": 2, "world_size": 4}, r"layout: world_size 4 is not tp\*pp\*dp\*cp = 2"),
        ({"tp": 2, "order": "tp-dp"}, r"layout: order 'tp-dp' must name tp, cp, ep, dp and pp"),
        ({"tp": 2, "rank": 1, "tp_rank": 0}, r"layout: tp_rank 0, but rank 1 of tp=2.* is tp_rank 1"),
        ({"ep": 2}, r"layout: ep 2 must divide dp\*cp = 1"),
        ({"tp": 2, "rank": 2}, r"layout: 'rank' must be an integer in 0..1, got 2"),
    ],
)
def test_a_layout_the_compare_would_refuse_is_refused_by_the_recorder(
    tmp_path: Path, layout: dict[str, Any], message: str
) -> None:
    from pytest_precalign import Recorder

    with pytest.raises(ConfigError, match=message):
        Recorder(tmp_path, layout=layout)
    with pytest.raises(TraceError, match=message.replace("layout:", "manifest.json: parallel:")):
        layout_from_manifest(layout, "manifest.json")


def test_the_expert_rank_is_megatrons() -> None:
    """megatron-core numbers expert ranks ``(rank // tp) % ep`` inside the data-parallel ranks."""
    layout = check_layout_block({"tp": 2, "dp": 2, "ep": 2}, "x")
    assert layout.world_size == 4
    assert [layout.coords(r)["ep"] for r in range(4)] == [0, 0, 1, 1]
    assert [layout.coords(r)["dp"] for r in range(4)] == [0, 0, 1, 1]
