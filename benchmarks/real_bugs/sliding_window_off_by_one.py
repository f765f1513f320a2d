"""Mistral's sliding-window mask let each token see ``sliding_window + 1`` keys
(transformers PR #26792, "Remove ambiguous padding_mask and instead use a 2D->4D Attn Mask
Mapper": the window's diagonal became ``past_key_values_length - sliding_window + 1``; the
eager/flash mismatch is transformers issue #29623).

Buggy side, a re-implementation quoting the fix: the window overlay tests
``kv_idx >= q_idx - sliding_window`` (the old ``torch.triu(..., diagonal=-sliding_window)``)
instead of ``kv_idx > q_idx - sliding_window``. User path: a Mistral fine-tune in the user's
own loop recorded with ``Recorder`` (stats). Twin: rows no longer than the window (the bug
cannot fire)."""

from __future__ import annotations

from pathlib import Path

from _loop import train
from _tiny import build, main, small_config, token_rows

WINDOW = 4


def plant() -> None:
    from transformers import masking_utils

    def sliding_window_overlay(sliding_window: int):  # the pre-fix window: one key too many
        def inner_mask(batch_idx: int, head_idx: int, q_idx: int, kv_idx: int) -> bool:
            return kv_idx >= q_idx - sliding_window

        return inner_mask

    masking_utils.sliding_window_overlay = sliding_window_overlay


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    if side == "buggy":
        plant()
    model = build(MistralForCausalLM, small_config(MistralConfig, sliding_window=WINDOW, head_dim=8))
    rows = token_rows(16, 8, 14) if trigger else token_rows(16, 3, WINDOW)
    train(out, model, rows=rows)


if __name__ == "__main__":
    main(record)
