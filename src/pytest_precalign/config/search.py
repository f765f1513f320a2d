"""Config parts of the divergence search and of explicit token ids. No torch, no hypothesis.

``search:`` (a case key) bounds the inputs hypothesis may choose; ``kind: ids`` (an inputs
kind) is how a minimal example found by the search is written back into a config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..yaml_reader import Reader, describe

SEARCH_KEYS = ("max_examples", "batch", "seq_len", "vocab_size", "padding")
IDS_KEYS = ("kind", "input_ids", "attention_mask", "labels")
MAX_EXAMPLES_LIMIT = 10_000


@dataclass(frozen=True)
class SearchSpec:
    """Bounds of the inputs the search draws (inclusive ranges) and how many it tries."""

    max_examples: int = 30
    batch: tuple[int, int] = (1, 2)
    seq_len: tuple[int, int] = (1, 32)
    vocab_size: int = 0
    padding: bool = False  # also draw right padding (attention_mask zeros) per row
    labels: bool = False  # labels = input_ids (as the case's inputs say)
    attention_mask: bool = False  # pass an attention_mask even without padding


def parse_search(reader: Reader, vocab_size: int | None, labels: bool, attention_mask: bool) -> SearchSpec:
    """``vocab_size`` and ``labels`` default to the case's ``kind: tokens`` inputs."""
    reader.check_keys(SEARCH_KEYS)
    vocab = reader.get_int("vocab_size", vocab_size, minimum=1)
    if vocab is None:
        reader.fail(
            "missing required key 'vocab_size' (the case's inputs are not kind: tokens, so it has no default)"
        )
    spec = SearchSpec(
        max_examples=reader.get_int("max_examples", 30, minimum=1),
        batch=_range(reader, "batch", (1, 2)),
        seq_len=_range(reader, "seq_len", (1, 32)),
        vocab_size=vocab,
        padding=reader.get_bool("padding", False),
        labels=labels,
        attention_mask=attention_mask,
    )
    if spec.max_examples > MAX_EXAMPLES_LIMIT:
        reader.fail(f"must be <= {MAX_EXAMPLES_LIMIT}, got {spec.max_examples}", "max_examples")
    if spec.padding and spec.seq_len[1] < 2:
        reader.fail("padding needs seq_len of at least 2 (one real token and one pad)", "padding")
    reader.done()
    return spec


def _range(reader: Reader, key: str, default: tuple[int, int]) -> tuple[int, int]:
    value = reader.raw(key)
    if value is None:
        return default
    if _is_int(value):
        value = [value, value]
    if not (isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value)):
        reader.fail(f"expected [min, max] (two integers) or one integer, got {describe(value)}", key)
    low, high = int(value[0]), int(value[1])
    if low < 1 or high < low:
        reader.fail(f"expected 1 <= min <= max, got [{low}, {high}]", key)
    return low, high


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_ids(reader: Reader) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...] | None]:
    """``input_ids: [[...], ...]`` (rectangular, non-negative integers) and an optional
    ``attention_mask`` of the same shape holding 0/1 with at least one 1 per row."""
    reader.check_keys(IDS_KEYS)
    ids = _matrix(reader, "input_ids", required=True)
    assert ids is not None
    mask = _matrix(reader, "attention_mask", required=False)
    if mask is not None:
        shape = (len(ids), len(ids[0]))
        if (len(mask), len(mask[0])) != shape:
            reader.fail(
                f"expected the shape of input_ids {list(shape)}, got {[len(mask), len(mask[0])]}",
                "attention_mask",
            )
        for i, row in enumerate(mask):
            if any(v not in (0, 1) for v in row):
                reader.fail(f"row {i}: expected only 0 and 1, got {list(row)}", "attention_mask")
            if 1 not in row:
                reader.fail(f"row {i}: every row needs at least one 1 (a real token)", "attention_mask")
    return ids, mask


def _matrix(reader: Reader, key: str, *, required: bool) -> tuple[tuple[int, ...], ...] | None:
    value = reader.require(key) if required else reader.raw(key)
    if value is None:
        return None
    expected = "a non-empty list of equally long, non-empty lists of integers >= 0"
    if not isinstance(value, list) or not value or not all(isinstance(r, list) and r for r in value):
        reader.fail(f"expected {expected}, got {describe(value)}", key)
    for i, row in enumerate(value):
        bad = next((v for v in row if not _is_int(v) or v < 0), None)
        if bad is not None or any(not _is_int(v) for v in row):
            reader.fail(f"row {i}: expected integers >= 0, got {bad!r}", key)
        if len(row) != len(value[0]):
            reader.fail(
                f"row {i} has {len(row)} values, row 0 has {len(value[0])}: rows must be equally long", key
            )
    return tuple(tuple(int(v) for v in row) for row in value)


def ids_block(name: str, ids: list[list[int]], mask: list[list[int]] | None, labels: bool) -> str:
    """A ready-to-paste ``inputs:`` YAML block holding exactly these inputs."""
    lines = ["inputs:", f"  {name}:", "    kind: ids", f"    input_ids: {_flow(ids)}"]
    if mask is not None:
        lines.append(f"    attention_mask: {_flow(mask)}")
    if labels:
        lines.append("    labels: true")
    return "\n".join(lines)


def _flow(rows: list[list[int]]) -> str:
    return "[" + ", ".join("[" + ", ".join(str(v) for v in row) + "]" for row in rows) + "]"
