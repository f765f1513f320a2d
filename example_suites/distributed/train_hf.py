"""The Hugging Face twin of train_megatron.py: one process, the same weights, data and AdamW.

python train_hf.py --steps 2 --out DIR
python -m torch.distributed.run --nproc_per_node 2 train_hf.py --fsdp2 --steps 2 --out DIR  # FSDP2, DP=2

``--fsdp2``: under torchrun (gloo), ``fully_shard`` on each decoder layer and the root, each rank
training its contiguous share of every step's rows (as ``train_megatron.py --split-rows``).
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
p.add_argument("--fsdp2", action="store_true", help="under torchrun: FSDP2, each rank its share of the rows")
args = p.parse_args()
rank, world = 0, 1
if args.fsdp2:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = Qwen2ForCausalLM(hf_config())
model.load_state_dict(hf_weights(), strict=True)
model.train()
if args.fsdp2:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
rec = Recorder(args.out, mode=args.mode) if args.out else None
for step_rows in batches(args.steps):
    share = step_rows.shape[0] // world
    tokens = step_rows[rank * share : (rank + 1) * share]
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
if args.fsdp2:
    dist.destroy_process_group()
elif args.save:
    torch.save({"loss": loss.detach(), "params": dict(model.named_parameters())}, f"{args.save}.pt")
