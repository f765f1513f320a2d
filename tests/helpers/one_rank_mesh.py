"""A 1-rank gloo process group and its CPU device mesh, for tests that build DTensors in this
process (a module fixture yields from ``one_rank_mesh``; the group is destroyed after)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def one_rank_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()
