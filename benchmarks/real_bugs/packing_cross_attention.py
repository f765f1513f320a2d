"""Padding-free packing (``DataCollatorWithFlattening``: a micro-batch's rows concatenated
into one row, ``position_ids`` restarting at each row) let eager and SDPA attention attend
across the packed rows: only flash-attention read the boundaries from ``position_ids``
(transformers PR #39194, which finds the packed sequences from ``position_ids`` in the mask
code, ``masking_utils.find_packed_sequence_indices``, for every attention).

Buggy side, a re-implementation: ``find_packed_sequence_indices`` returns None (one sequence
per row: what the masks assumed before the fix). User path: a Trainer fine-tune with
``DataCollatorWithFlattening`` recorded with ``PrecalignCallback(mode="stats")``. Twin: one
row per micro-batch, where nothing is packed."""

from __future__ import annotations

from pathlib import Path

from _tiny import main, tiny_qwen2
from _trainer import finetune


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import DataCollatorWithFlattening, masking_utils

    if side == "buggy":
        masking_utils.find_packed_sequence_indices = lambda position_ids: None
    collator = DataCollatorWithFlattening(return_position_ids=True)
    if trigger:
        finetune(out, tiny_qwen2(), collator=collator, mode="stats", steps=4)
    else:
        finetune(out, tiny_qwen2(), collator=collator, mode="stats", steps=4, per_device=1)


if __name__ == "__main__":
    main(record)
