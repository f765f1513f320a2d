"""A Qwen2 checkpoint with ``"use_sliding_window": false`` and a ``sliding_window`` value
(DeepSeek-R1-Distill-Qwen's config) still ran sliding-window attention: logits past the
window differed from the same model with ``sliding_window=None`` (transformers issue #38002,
"use_sliding_window doesn't work as expected"). The eager/SDPA mask of
``Qwen2Model._prepare_4d_causal_attention_mask_with_cache_position`` tested only
``config.sliding_window is not None``; from 4.52 it also tests ``use_sliding_window``.

Buggy and fixed releases from the registry: transformers 4.51.3 (the last with the window
applied whatever ``use_sliding_window`` says) and 4.52.4 (fixed; 4.52.0 was the first with
the fix, 4.52.4 its last patch), each in its own venv, the same script. User path: the
user's own fine-tune loop recorded with ``Recorder`` (stats). Twin: the same upgrade on rows
no longer than the window, where both attend the same keys."""

from __future__ import annotations

from pathlib import Path

from _loop import train
from _tiny import build, main, small_config, token_rows

WINDOW = 4


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = small_config(Qwen2Config, use_sliding_window=False, sliding_window=WINDOW, max_window_layers=0)
    model = build(Qwen2ForCausalLM, config)
    rows = token_rows(16, 8, 14) if trigger else token_rows(16, 3, WINDOW)
    train(out, model, rows=rows)


if __name__ == "__main__":
    main(record)
