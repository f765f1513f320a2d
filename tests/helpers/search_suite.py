"""The divergence search's suite: a tiny Qwen2 pair whose candidate's attention mask is wrong
from position 16 on, and a case that searches for it (tests/test_search.py and
tests/integration/test_search.py)."""

from __future__ import annotations

# A candidate whose attention mask is wrong only for query positions >= 16: from there on
# it cannot see position 0 (as if a 16-token sliding window had leaked into full attention).
MASK_BUG = """
import torch


def patch(model):
    for layer in model.model.layers:
        attn = layer.self_attn
        original = attn.forward

        def forward(*args, attention_mask=None, _original=original, **kwargs):
            if attention_mask is not None and attention_mask.shape[-2] > 16:
                attention_mask = attention_mask.clone()
                attention_mask[..., 16:, 0] = torch.finfo(attention_mask.dtype).min
            return _original(*args, attention_mask=attention_mask, **kwargs)

        attn.forward = forward
    return model
"""

QWEN = (
    "{source: hf, class: transformers.Qwen2ForCausalLM, attn_implementation: eager, "
    "config: {vocab_size: 64, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, "
    "num_attention_heads: 2, num_key_value_heads: 1}"
)

CONFIG = f"""\
version: 1
models:
  base: {QWEN}}}
  cand: {QWEN}, patch: "mask_bug:patch"}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 12, vocab_size: 64, labels: true}}
cases:
  - name: window
    baseline: base
    candidate: cand
    inputs: toks
    search: {{max_examples: 25, batch: [1, 2], seq_len: [1, 24]}}
"""
