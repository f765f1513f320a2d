"""A user's PyTorch Lightning run, as a user writes it, recorded with
``PrecalignLightningCallback`` (run as a script in a subprocess by the tests):

    python lightning_run.py OUT.json [--root ROOT] [--mode stats] [--model mlp|llm]
        [--clip 0.05] [--accumulate 2] [--steps 4] [--lr 0.05]
        [--schedule warmup_cosine|constant] [--batch 2]
    python -m torch.distributed.run --standalone --nproc_per_node 2 lightning_run.py OUT.json
        --strategy ddp|model_parallel ...      # each rank writes OUT.json.rank<R>

``--strategy``: Lightning's own data-parallel strategy over the torchrun ranks (CPU, gloo), each
rank every other row of the global batch (``DistributedSampler(shuffle=False)``, given with
``use_distributed_sampler=False``: the sampler Lightning injects always shuffles the training
rows, so a 1-rank run would see other batches; ``--shuffled`` lets it); ``model_parallel`` shards the decoder layers and
the root with FSDP2's ``fully_shard`` in ``configure_model``.

OUT.json gets what the run itself saw (no recording involved): every micro-batch's loss as
``training_step`` returned it, every step's LR and pre-clip grad norm (the module's own
``on_before_optimizer_step``) and a digest of the trained parameters, so the tests can check
that recording changed nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from tests.helpers.tiny_lm import tiny_causal_lm

ROWS = 2  # rows per micro-batch
# A CPU run that writes nothing of its own (no logger, checkpoint, progress bar or summary).
QUIET = {
    "accelerator": "cpu",
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def token_ids(count: int) -> torch.Tensor:
    """The token rows of the ``llm`` runs (also ``trainer_run.py``'s)."""
    return torch.randint(0, 64, (count, 8), generator=torch.Generator().manual_seed(1))


class Rows(Dataset[Any]):
    def __init__(self, kind: str, count: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.kind = kind
        if kind == "llm":
            self.ids = token_ids(count)
        else:
            self.x = torch.randn(count, 6, generator=g)
            self.y = torch.randn(count, 3, generator=g)
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, j: int) -> Any:
        if self.kind == "llm":
            return {"input_ids": self.ids[j], "labels": self.ids[j].clone()}
        return self.x[j], self.y[j]


def tiny_model(kind: str) -> torch.nn.Module:
    if kind == "llm":
        return tiny_causal_lm("llama", vocab=64, hidden=16, layers=1, positions=16)  # type: ignore[no-any-return]
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


class Module(L.LightningModule):
    def __init__(self, kind: str, lr: float, steps: int, schedule: str = "warmup_cosine") -> None:
        super().__init__()
        self.kind = kind
        self.model = tiny_model(kind)
        self.lr = lr
        self.steps = steps
        self.schedule = schedule
        self.seen: dict[str, list[Any]] = {"micro_losses": [], "lr": [], "grad_norm": []}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.kind == "llm":
            loss = self.model(**batch).loss
        else:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.seen["micro_losses"].append(loss.item())
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.seen["grad_norm"].append(float(torch.nn.utils.get_total_norm(grads, 2.0)))
        self.seen["lr"].append([g["lr"] for g in optimizer.param_groups])

    def configure_optimizers(self) -> Any:
        decay = [p for p in self.parameters() if p.ndim > 1]
        rest = [p for p in self.parameters() if p.ndim <= 1]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=self.lr
        )
        if self.schedule == "constant":
            return optimizer
        warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=2)
        decay_after = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.steps)
        scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, decay_after], milestones=[2])
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Sharded(Module):
    """FSDP2 through Lightning's ``ModelParallelStrategy``: ``configure_model`` shards."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        layers = getattr(getattr(self.model, "model", None), "layers", [])
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


def strategy_of(name: str) -> dict[str, Any]:
    """The Trainer's arguments for ``--strategy`` over the torchrun ranks."""
    import os

    if name == "none":
        return {}
    devices = int(os.environ["WORLD_SIZE"])
    if name == "model_parallel":
        from lightning.pytorch.strategies import ModelParallelStrategy

        return {
            "devices": devices,
            "strategy": ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1),
        }
    return {"devices": devices, "strategy": name}


def loader(data: Dataset[Any], batch: int, ranks: int, shuffled: bool = False) -> DataLoader[Any]:
    """The rows in order; over several ranks each rank every ``ranks``-th row (not shuffled);
    ``shuffled``: a plain DataLoader, Lightning injecting its shuffling ``DistributedSampler``."""
    if ranks == 1 or shuffled:
        return DataLoader(data, batch_size=batch, shuffle=False)
    import os

    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(data, num_replicas=ranks, rank=int(os.environ["RANK"]), shuffle=False)
    return DataLoader(data, batch_size=batch, sampler=sampler)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--root")
    parser.add_argument("--mode", default="stats")
    parser.add_argument("--model", default="mlp", choices=["mlp", "llm"])
    parser.add_argument("--clip", type=float, default=0.0)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--schedule", default="warmup_cosine", choices=["warmup_cosine", "constant"])
    parser.add_argument("--batch", type=int, default=ROWS, help="rows per micro-batch (and rank)")
    parser.add_argument("--strategy", default="none", choices=["none", "ddp", "model_parallel"])
    parser.add_argument("--shuffled", action="store_true", help="Lightning's own (shuffling) sampler")
    args = parser.parse_args()

    callbacks = []
    if args.root:
        from pytest_precalign import PrecalignLightningCallback

        callbacks.append(PrecalignLightningCallback(args.root, mode=args.mode, module="model"))
    sharded = strategy_of(args.strategy)
    ranks = sharded.get("devices", 1)
    data = Rows(args.model, args.steps * args.batch * args.accumulate * ranks)
    module = (Sharded if args.strategy == "model_parallel" else Module)(
        args.model, args.lr, args.steps, args.schedule
    )
    trainer = L.Trainer(
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=args.clip or None,
        callbacks=callbacks,
        **{**QUIET, **sharded},
        **({"use_distributed_sampler": False} if ranks > 1 and not args.shuffled else {}),
    )
    trainer.fit(module, loader(data, args.batch, ranks, args.shuffled))
    digest = hashlib.sha256()
    for p in module.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        digest.update(full.detach().numpy().tobytes())
    out = f"{args.out}.rank{trainer.global_rank}" if ranks > 1 else args.out
    with open(out, "w") as f:
        json.dump({**module.seen, "params": digest.hexdigest()}, f)


if __name__ == "__main__":
    main()
