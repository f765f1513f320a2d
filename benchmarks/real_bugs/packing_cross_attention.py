"""Padding-free packing (``DataCollatorWithFlattening``: a micro-batch's rows concatenated
into one row, ``position_ids`` restarting at each row) let eager and SDPA attention attend
across the packed rows: only flash-attention read the boundaries from ``position_ids``
(transformers PR #39194, which finds the packed sequences from ``position_ids`` in the mask
code, ``masking_utils.find_packed_sequence_indices``, for every attention).

Buggy and fixed releases from the registry: transformers 4.53.0 (``create_causal_mask``
without packed sequences) and 4.53.1 (the first with ``find_packed_sequence_indices``),
each in its own venv, the same script. 4.53.1 reads the packed rows only when no cache is
passed (``past_key_values is None``); with the config's default ``use_cache=True`` its Qwen2
builds a ``DynamicCache`` in training too and the fix does not apply (both releases then agree:
found by this benchmark), so the run sets ``use_cache=False``, as fine-tuning scripts do. User
path: a Trainer fine-tune with ``DataCollatorWithFlattening`` recorded with
``PrecalignCallback(mode="stats")``. Twin: the
same upgrade with one row per micro-batch, where nothing is packed."""

from __future__ import annotations

from pathlib import Path

from _tiny import main, tiny_qwen2
from _trainer import finetune


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import DataCollatorWithFlattening

    collator = DataCollatorWithFlattening(return_position_ids=True)
    if trigger:
        finetune(out, tiny_qwen2(use_cache=False), collator=collator, mode="stats", steps=4)
    else:
        finetune(out, tiny_qwen2(use_cache=False), collator=collator, mode="stats", steps=4, per_device=1)


if __name__ == "__main__":
    main(record)
