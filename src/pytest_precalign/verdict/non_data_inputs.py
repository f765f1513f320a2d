"""Module inputs that are not data: attention masks, position and cache tensors, flags.

Between two releases of a framework these change form without changing what a module
computes: a 4-D float mask becomes a boolean one or none at all, ``cache_position`` appears,
``position_ids`` changes shape. Such an input whose shape, dtype or presence changed between
the sides is **set aside**: it neither vouches for a module (it was not compared) nor
condemns it (its difference is one of form), and every verdict that set one aside names it.
An input of the same form on both sides is compared like any other: a mask whose values
changed still counts.
"""

from __future__ import annotations

from ..compare.pairs import PairResult
from ..trace.records import Record

# Keyword names (the slot's last part) of the inputs that steer a computation rather than
# feed it: masks, positions, caches and flags.
NON_DATA_WORDS = ("mask", "position", "cache", "flag", "seqlens", "indices")


def non_data(rec: Record) -> bool:
    """An input record that is not data: named as a mask, position, cache or flag, or a
    boolean tensor (token ids are data: they are not set aside)."""
    if rec.kind != "input":
        return False
    if rec.dtype == "bool":
        return True
    key = rec.slot.rsplit(".", 1)[-1].lower() if rec.slot.startswith("in.") else ""
    if key.isdigit() and rec.slot.count(".") >= 2:  # in.position_embeddings.0: its container's name
        key = rec.slot.split(".")[1].lower()
    return any(word in key for word in NON_DATA_WORDS)


def set_aside(pair: PairResult) -> bool:
    """A non-data input whose form changed between the sides: a partner missing, or another
    shape or dtype."""
    if not non_data(pair.record):
        return False
    other = pair.candidate
    if other is None or not pair.paired:
        return True
    return other.shape != pair.record.shape or other.dtype != pair.record.dtype


def shown_slot(rec: Record) -> str:
    """``attention_mask`` for ``in.attention_mask``, ``input 1`` for ``in.1``."""
    key = rec.slot.removeprefix("in.")
    return f"input {key}" if key.isdigit() else key
