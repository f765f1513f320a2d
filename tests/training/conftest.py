from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def megatron_world() -> Iterator[None]:
    """A world-size-1 gloo group with Megatron's model-parallel state (TP=PP=1)."""
    pytest.importorskip("megatron.core")
    from .megatron_tiny import megatron_world as world

    yield from world()
