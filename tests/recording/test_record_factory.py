"""``new_record`` builds the very ``Record`` the dataclass would: equal, every field (defaults
included) set, frozen as before; a draft's id is its record's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_precalign.recording.record_factory import Draft, draft_id, new_record
from pytest_precalign.trace.records import Record, Stats


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_a_fast_record_is_the_dataclasses_record(dtype: torch.dtype) -> None:
    t = torch.zeros(2, 3, dtype=dtype)
    stats = Stats(1.0, -1.0, 0.5, 2.0)
    fields = ("layers.0.mlp", "MLP", "grad_output", 2, 1, "out.0", t.dtype, t.shape)
    fast = new_record(4, *fields, stats, None, "t0000004", ("a|b",))  # type: ignore[arg-type]
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
    assert type(fast.shape) is tuple
    draft: Draft = (*fields, (3,), 0, None, None)  # type: ignore[assignment]
    assert draft_id(draft) == slow.id
