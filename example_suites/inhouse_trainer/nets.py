"""A tiny causal LM (embedding, one MLP block, head) built from a fixed seed; ``scale`` != 1
is a port that scales the block's output (the candidate's bug)."""

from __future__ import annotations

import torch


class TinyLM(torch.nn.Module):
    def __init__(self, scale=1.0):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, 16)
        self.block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        self.head = torch.nn.Linear(16, 32)
        self.scale = scale

    def forward(self, input_ids):
        hidden = self.embed(input_ids)
        return self.head(hidden + self.scale * self.block(hidden))


def build(scale=1.0):
    return TinyLM(scale)
