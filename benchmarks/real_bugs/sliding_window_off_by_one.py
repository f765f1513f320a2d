"""Mistral's eager sliding-window mask let each token see ``sliding_window + 1`` keys
(``AttentionMaskConverter._make_causal_mask``: ``diagonal = past_key_values_length -
sliding_window - 1`` with ``torch.tril``, since transformers PR #26792, "Remove ambiguous
padding_mask and instead use a 2D->4D Attn Mask Mapper", and its follow-ups; the eager/flash
mismatch is transformers issue #29623). Mistral's own ``_update_causal_mask`` (transformers
4.42.0) masks ``arange(target_length) <= cache_position - sliding_window``: ``sliding_window``
keys, as the model was trained.

Buggy and fixed releases from the registry: transformers 4.41.2 (the last whose Mistral builds
its eager mask with ``_prepare_4d_causal_attention_mask(..., sliding_window=...)``) and 4.42.0
(the first with ``_update_causal_mask``), each in its own venv, the same script. User path: a
Mistral fine-tune in the user's own loop recorded with ``Recorder`` (stats; the loss from the
logits: 4.41's ``forward`` takes no ``num_items_in_batch``). Twin: the same upgrade on rows no
longer than the window (the bug cannot fire)."""

from __future__ import annotations

from pathlib import Path

from _loop import logits_loss, train
from _tiny import build, main, small_config, token_rows

WINDOW = 4


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    model = build(MistralForCausalLM, small_config(MistralConfig, sliding_window=WINDOW))
    rows = token_rows(16, 8, 14) if trigger else token_rows(16, 3, WINDOW)
    train(out, model, rows=rows, loss=logits_loss)


if __name__ == "__main__":
    main(record)
