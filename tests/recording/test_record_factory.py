"""``new_record`` / ``with_summary`` build the very ``Record`` the dataclass would: equal, every
field (defaults included) set, frozen as before."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_precalign.recording.record_factory import new_record, with_summary
from pytest_precalign.trace.records import Record, Stats


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_a_fast_record_is_the_dataclasses_record(dtype: torch.dtype) -> None:
    t = torch.zeros(2, 3, dtype=dtype)
    stats = Stats(1.0, -1.0, 0.5, 2.0)
    fast = new_record(
        4, "layers.0.mlp", "MLP", "grad_output", 2, 1, "out.0", t, stats, None, "t0000004", ("a|b",)
    )
    slow = Record(
        seq=4,
        name="layers.0.mlp",
        module_class="MLP",
        phase="backward",
        step=2,
        call=1,
        kind="grad_output",
        slot="out.0",
        dtype=str(dtype).removeprefix("torch."),
        shape=(2, 3),
        stats=stats,
        crc32=None,
        tensor_key="t0000004",
        deps=("a|b",),
    )
    assert fast == slow and dataclasses.asdict(fast) == dataclasses.asdict(slow)
    assert fast.id == slow.id and fast.merged == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seq = 5  # type: ignore[misc]
    summarised = with_summary(fast, None, "deadbeef")
    assert summarised == dataclasses.replace(slow, stats=None, crc32="deadbeef") and fast.crc32 is None
