"""DP replicas that ran different micro-batches of a step merge as one process's calls; their
parameter records must agree."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pytest_precalign.errors import TraceError
from pytest_precalign.parallel.data_split import merge_data_split
from pytest_precalign.trace.records import Record


def _rec(name: str, kind: str, call: int, deps: tuple[str, ...] = ()) -> Record:
    phase = "step" if kind == "param" else ("backward" if kind == "param_grad" else "forward")
    return Record(0, name, "M", phase, 0, call, kind, "out", "float32", (2,), deps=deps)  # type: ignore[arg-type]


def _replica() -> list[Record]:
    logits = _rec("logits", "output", 0)
    return [logits, _rec("loss", "loss", 0, (logits.id,)), _rec("w", "param_grad", 0), _rec("w", "param", 0)]


def test_replica_calls_follow_replica_zeros_and_params_are_kept_once() -> None:
    checked: list[int] = []

    def check(a: Sequence[Record], b: Sequence[Record], index: int) -> None:
        assert [r.id for r in a] == [r.id for r in b]
        checked.append(index)

    merged = merge_data_split([_replica(), _replica()], check, "run")
    assert [(r.name, r.call) for r in merged] == [
        ("logits", 0), ("loss", 0), ("logits", 1), ("loss", 1), ("w", 0), ("w", 0),
    ]  # fmt: skip
    assert merged[3].deps == (merged[2].id,)  # a replica's deps follow its renumbered records
    assert [r.seq for r in merged] == list(range(6)) and checked == [1]


def test_replicas_with_other_call_counts_are_an_error() -> None:
    other = [*_replica(), _rec("logits", "output", 1)]
    with pytest.raises(TraceError, match="DP replica 1 recorded other modules or call counts"):
        merge_data_split([_replica(), other], lambda a, b, i: None, "run")
