"""Model sources that the end-to-end tests write into a pytester folder as ``nets.py``.

``MLP_NETS``: a small MLP stack (no downloads, a few seconds a case) whose ``bug`` breaks
block ``bug_block``, in the block's own code (``"own"``: the block is the origin) or between its
submodules (``"between"``: entering before ``up``, propagated into the block); ``crash()``
builds a model whose forward kills its process (a worker dying mid-case)."""

from __future__ import annotations

from pathlib import Path

MLP_NETS = """
import torch


class Block(torch.nn.Module):
    def __init__(self, width, bug=None):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(2 * width, width)
        self.bug = bug

    def forward(self, x):
        h = self.norm(x)
        if self.bug == "between":
            h = h * 1.5          # parent code between children: enters before `up`
        h = self.down(self.act(self.up(h)))
        if self.bug == "own":
            h = h + 0.25         # the block's own code, after its children
        return x + h


class Net(torch.nn.Module):
    def __init__(self, vocab=50, width=16, depth=3, bug=None, bug_block=1):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(
            Block(width, bug if i == bug_block else None) for i in range(depth)
        )
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(**kwargs):
    return Net(**kwargs)


class Crash(Net):
    def forward(self, input_ids):
        import os

        os._exit(3)              # a process dying mid-case (think: killed for memory)


def crash():
    return Crash()
"""

# A config written from scratch (not the example suite): one case, ``port``, whose candidate
# breaks block 1 of ``MLP_NETS`` (``bug``: null, own or between), in record mode ``mode``.
MLP_CONFIG = """
version: 1
models:
  ref: {{source: factory, factory: "nets:build"}}
  cand: {{source: factory, factory: "nets:build", kwargs: {{bug: {bug}, bug_block: 1}}}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}}
tolerances:
  tight:
    - {{match: "*", atol: 1.0e-6, rtol: 1.0e-5, why: "fp32 same-code budget"}}
cases:
  - {{name: port, baseline: ref, candidate: cand, inputs: toks, phases: [forward, backward, step],
     optimizer: {{name: adamw, lr: 0.01}}, record: {{mode: {mode}}}, tolerances: tight}}
"""


def write_mlp_suite(folder: Path, bug: str = "null", mode: str = "tensor") -> Path:
    """``nets.py`` and ``align.yaml`` (case ``port``) in ``folder``; returns the config."""
    (folder / "nets.py").write_text(MLP_NETS, encoding="utf-8")
    config = folder / "align.yaml"
    config.write_text(MLP_CONFIG.format(bug=bug, mode=mode), encoding="utf-8")
    return config
