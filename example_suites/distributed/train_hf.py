"""The Hugging Face twin of train_megatron.py: one process, the same weights, data and AdamW.

python train_hf.py --steps 2 --out DIR
"""

from __future__ import annotations

import argparse

import torch
from tiny_qwen import LR, batches, hf_config, hf_weights
from transformers import Qwen2ForCausalLM

from pytest_precalign import Recorder

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2)
p.add_argument("--out", default=None, help="record into this folder (no recording without it)")
p.add_argument("--mode", default="tensor")
p.add_argument("--save", default=None, help="torch.save(loss, params) to SAVE.pt")
args = p.parse_args()

torch.manual_seed(0)
model = Qwen2ForCausalLM(hf_config())
model.load_state_dict(hf_weights(), strict=True)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
rec = Recorder(args.out, mode=args.mode) if args.out else None
for tokens in batches(args.steps):
    if rec is not None:
        rec.start(model)
    logits = model(input_ids=tokens[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    if rec is not None:
        rec.record_output("logits", logits)
        rec.record_output("loss", loss)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if rec is not None:
        rec.stop()
        rec.step()
if args.save:
    torch.save({"loss": loss.detach(), "params": dict(model.named_parameters())}, f"{args.save}.pt")
