"""A user's custom Accelerate loop (CPU, gradient accumulation, clipping, warmup + linear
decay), recorded with ``AccelerateSteps`` (run as a script in a subprocess by the tests):

    python accelerate_run.py OUT.json [--root ROOT] [--mode stats] [--clip 0.05]
        [--accumulate 2] [--steps 4] [--lr 0.05]

OUT.json gets what the loop itself saw (no recording involved): every micro-batch's loss,
the pre-clip norm ``clip_grad_norm_`` returned, each update's LR and a digest of the trained
parameters, so the tests can check that recording changed nothing. Without ``--root`` the
loop calls the accelerator directly (the loop before the three lines were added). Under
torchrun (DDP over gloo) each rank writes ``OUT.json.rank<R>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

ROWS = 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--root")
    parser.add_argument("--mode", default="stats")
    parser.add_argument("--clip", type=float, default=0.05)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.accumulate, cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(1)
    rows = args.steps * args.accumulate * ROWS
    data = TensorDataset(torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g))
    loader = DataLoader(data, batch_size=ROWS, shuffle=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 2) * max(0.0, 1 - s / (args.steps + 1))
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    seen: dict[str, list[float]] = {"micro_losses": [], "grad_norm": [], "lr": []}

    steps = None
    if args.root:
        from pytest_precalign import AccelerateSteps

        steps = AccelerateSteps(
            args.root,
            accelerator,
            model,
            optimizer,
            scheduler=scheduler,
            total_steps=args.steps,
            mode=args.mode,
        )
    for x, y in loader:
        with accelerator.accumulate(model):
            if steps is not None:
                steps.micro_batch((x, y))
            loss = torch.nn.functional.mse_loss(model(x), y)
            seen["micro_losses"].append(loss.item())
            (steps or accelerator).backward(loss)
            if accelerator.sync_gradients:
                norm = (steps or accelerator).clip_grad_norm_(model.parameters(), args.clip)
                seen["grad_norm"].append(float(norm))
                seen["lr"].append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    if steps is not None:
        steps.close()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    rank = os.environ.get("RANK")  # under torchrun (DDP over gloo): one file per rank
    with open(args.out if rank is None else f"{args.out}.rank{rank}", "w") as f:
        json.dump({**seen, "params": digest.hexdigest()}, f)


if __name__ == "__main__":
    main()
