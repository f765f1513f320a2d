"""Every writer of a user's run, each given planted secrets the way a user hands them over (run
as a script in a subprocess by ``test_secrets.py``):

    python secret_writers.py OUT WRITER...

WRITER: ``recorder`` (a loop's parsed arguments to ``Recorder.record_settings``, native and
msprobe formats), ``trainer`` (a ``transformers.Trainer`` with TRL's ``SFTConfig`` whose
``model_init_kwargs`` hold a token, and a model config holding secrets, ``PrecalignCallback``),
``lightning`` (``PrecalignLightningCallback``), ``accelerate`` (``AccelerateSteps``). Each
writes ``OUT/<writer>/...``. The model of every run carries a Hugging Face config that holds
the secrets too (a user's config with a W&B key and a data URL with credentials).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

HF = "hf_" + "Q" * 34
WANDB = "0123456789abcdef" * 2 + "01234567"  # 40 hex digits: only the key names it
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"
URL_PASSWORD = "pa55w0rd-in-url"
OPENAI = "sk-" + "z" * 40
SECRETS = (HF, WANDB, AWS, URL_PASSWORD, OPENAI)


def user_config() -> Any:
    from transformers import PretrainedConfig

    return PretrainedConfig(
        wandb_api_key=WANDB,
        data_url=f"s3://trainer:{URL_PASSWORD}@bucket/data",
        notes=f"ran with {OPENAI}",
    )


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model.config = user_config()  # type: ignore[assignment]
    return model


def recorder(out: Path) -> None:
    from pytest_precalign import Recorder

    parser = argparse.ArgumentParser()
    for name in ("--hf_token", "--wandb_api_key", "--data", "--aws_access_key_id", "--lr"):
        parser.add_argument(name)
    args = parser.parse_args(
        ["--hf_token", HF, "--wandb_api_key", WANDB, "--data", f"s3://u:{URL_PASSWORD}@b/x",
         "--aws_access_key_id", AWS, "--lr", "0.1"]
    )  # fmt: skip
    for fmt in ("native", "msprobe"):
        model = tiny()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with Recorder(out / fmt, mode="stats", format=fmt) as rec:
            rec.record_settings(model, optimizer, steps=2, arguments=vars(args))
            for _ in range(2):
                with rec.recording(model):
                    loss = model(torch.ones(2, 6)).square().mean()
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()


def trainer(out: Path) -> None:
    from transformers import Trainer
    from trl import SFTConfig

    from pytest_precalign import PrecalignCallback
    from tests.helpers.tiny_lm import tiny_causal_lm

    model = tiny_causal_lm(vocab=64, hidden=16, layers=1)
    model.config.hub_token = HF  # a secret in the model's own config
    model.config.data_url = f"https://u:{URL_PASSWORD}@example.org/rows?token={OPENAI}"
    ids = torch.randint(0, 64, (4, 6), generator=torch.Generator().manual_seed(1))
    rows = [{"input_ids": r, "labels": r} for r in ids]
    args = SFTConfig(
        output_dir=str(out / "trainer_out"),
        max_steps=2,
        per_device_train_batch_size=2,
        report_to=[],
        bf16=False,
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        model_init_kwargs={"token": HF, "revision": "main"},
        hub_token=HF,
    )
    callback = PrecalignCallback(out / "rec", mode="stats")
    Trainer(model=model, args=args, train_dataset=rows, callbacks=[callback]).train()


def lightning(out: Path) -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from pytest_precalign import PrecalignLightningCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny()

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g))
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PrecalignLightningCallback(out / "rec", mode="stats", module="model")],
    )
    trainer.fit(Module(), DataLoader(data, batch_size=2))


def accelerate(out: Path) -> None:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    from pytest_precalign import AccelerateSteps

    accelerator = Accelerator(cpu=True)
    model = tiny()
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=2))
    steps = AccelerateSteps(out / "rec", accelerator, model, optimizer, total_steps=2, mode="stats")
    for x, y in loader:
        steps.micro_batch((x, y))
        loss = torch.nn.functional.mse_loss(model(x), y)
        steps.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    steps.close()


WRITERS = {"recorder": recorder, "trainer": trainer, "lightning": lightning, "accelerate": accelerate}


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    for name in argv[1:]:
        WRITERS[name](out / name)


if __name__ == "__main__":
    main(sys.argv[1:])
