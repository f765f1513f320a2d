"""Attention over a row whose keys are all masked gave NaN (softmax of all ``-inf``), and the
NaN of left-padded positions spread through ``0 * NaN`` into every later token: torch's SDPA
now zeroes fully masked rows (pytorch PR #131060, "Add a private _safe_softmax", and
PR #133882 calling it from SDPA's math path; the reports are pytorch issues #41508 and
#103749, a user's own attention calling it with a padding mask).

Buggy and fixed releases from the registry: torch 2.4.1 and 2.5.1, each in its own venv (the
Linux wheels of both are CUDA builds: ~5 GB a venv with their nvidia wheels), the same script.
Measured on the CPU, a causal mask and a left-padded row, ``F.scaled_dot_product_attention``
in its default dispatch: 2.4.1 has no ``torch.ops.aten._safe_softmax`` and gives NaN on the
fully masked rows (forward and grads; the math and the CPU flash kernels alike), 2.5.1 has it
and gives zeros there.

User path: the user's own tiny causal LM calling ``torch.nn.functional.scaled_dot_product_attention``
with a boolean mask (causal and the rows' left padding, so a padded query sees no key),
trained by the user's own loop recorded with ``Recorder`` (stats). Twin: the same upgrade on
rows of one length (no padding), where no row is fully masked."""

from __future__ import annotations

from pathlib import Path

import torch
from _loop import train
from _tiny import VOCAB, main, pad_batch, token_rows

HIDDEN, HEADS, LAYERS = 32, 4, 2


class SelfAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(4)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(p: torch.nn.Linear) -> torch.Tensor:
            return p(x).view(b, t, HEADS, HIDDEN // HEADS).transpose(1, 2)

        out = torch.nn.functional.scaled_dot_product_attention(
            heads(self.q_proj), heads(self.k_proj), heads(self.v_proj), attn_mask=mask
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, HIDDEN))


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = torch.nn.LayerNorm(HIDDEN)
        self.self_attn = SelfAttention()
        self.post_attention_layernorm = torch.nn.LayerNorm(HIDDEN)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, 64), torch.nn.GELU(), torch.nn.Linear(64, HIDDEN)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyCausalLM(torch.nn.Module):
    """The user's own model: embeddings, 2 pre-norm blocks, a head; the loss per token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        mask = causal[None, None] & attention_mask.bool()[:, None, None, :]  # a padded query: no key
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return self.lm_head(self.norm(x))


def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], tokens: int) -> torch.Tensor:
    logits = model(batch["input_ids"], batch["attention_mask"])[:, :-1]
    labels = batch["labels"][:, 1:].reshape(-1)
    flat = logits.reshape(-1, VOCAB)
    return torch.nn.functional.cross_entropy(flat, labels, ignore_index=-100, reduction="sum") / tokens


def left_padded(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    return pad_batch(features, left=True)


def record(out: Path, side: str, trigger: bool) -> None:
    torch.manual_seed(0)
    model = TinyCausalLM()
    rows = token_rows(16) if trigger else token_rows(16, 10, 10)
    train(out, model, rows=rows, collate=left_padded, loss=loss)


if __name__ == "__main__":
    main(record)
