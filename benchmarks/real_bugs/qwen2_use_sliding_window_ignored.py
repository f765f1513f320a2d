"""A Qwen2 checkpoint with ``"use_sliding_window": false`` and a ``sliding_window`` value
(DeepSeek-R1-Distill-Qwen's config) still ran sliding-window attention: logits past the
window differed from the same model with ``sliding_window=None`` (transformers issue #38002,
"use_sliding_window doesn't work as expected"; the config now drops the window when
``use_sliding_window`` is false).

Buggy side, a re-implementation: the config's ``layer_types`` are ``sliding_attention``
although ``use_sliding_window`` is false (what the buggy release's attention did). User
path: the user's own fine-tune loop recorded with ``Recorder`` (stats). Twin: rows no longer
than the window, where both attend the same keys."""

from __future__ import annotations

from pathlib import Path

from _loop import train
from _tiny import build, main, small_config, token_rows

WINDOW = 4


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = small_config(Qwen2Config, use_sliding_window=False, sliding_window=WINDOW, max_window_layers=0)
    if side == "buggy":
        config.sliding_window = WINDOW
        config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    model = build(Qwen2ForCausalLM, config)
    rows = token_rows(16, 8, 14) if trigger else token_rows(16, 3, WINDOW)
    train(out, model, rows=rows)


if __name__ == "__main__":
    main(record)
