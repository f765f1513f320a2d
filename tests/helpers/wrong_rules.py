"""The classic tensor-parallel layout bug, as shard rules, for tests that the merge and the
comparison catch it: SwiGLU's fc1 gathered by plain concatenation, which yields
``[gate_0; up_0; gate_1; up_1]`` instead of ``[gate; up]`` (the right rule is ``gated``)."""

from __future__ import annotations

from dataclasses import replace

from pytest_precalign.parallel.rules import MEGATRON_GPT_RULES, ShardRule

WRONG_FC1_RULES: tuple[ShardRule, ...] = tuple(
    replace(r, layout="chunk", why="WRONG on purpose: fc1 concatenated as if [gate; up] were chunked")
    if r.layout == "gated"
    else r
    for r in MEGATRON_GPT_RULES
)
