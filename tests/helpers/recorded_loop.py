"""A user's own training loop recorded with ``pytest_precalign.Recorder`` (run as a script:
``python recorded_loop.py OUT``): a tiny language model (seed 0) trained 6 steps with AdamW
(two weight-decay groups), a warmup-then-decay LR schedule, clipping and 2 micro-batches,
with the step scalars measured by ``training.step_evidence`` as the Recorder's docs say.

Each variant is recorded in every mode and format, into ``OUT/<variant>-<recording>/``:

- ``base``, ``rerun``: the same run twice;
- ``linear``: the LR decays linearly instead of by a cosine from step 3 on (same before);
- ``layer``: ``proj`` computes its output 1% too large from step 3 on;
- ``data``: step 3's batch is another one.

Recordings: ``scalars`` (per-step scalars only), ``step3`` (layers on step 3 only),
``every`` (layers on every step), each ``-native`` or ``-msprobe``."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

from pytest_precalign import Recorder
from pytest_precalign.training.step_evidence import StepEvidence, batch_hash, group_settings, token_count

STEPS, ROWS, MICRO, VOCAB, FAULT_STEP = 6, 4, 2, 32, 3
RECORDINGS: dict[str, dict[str, Any]] = {
    "scalars": {"mode": "scalars"},
    "step3": {"mode": "stats", "steps": [FAULT_STEP]},
    "every": {"mode": "stats"},
}
VARIANTS = ("base", "rerun", "linear", "layer", "data")


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.proj = torch.nn.Linear(16, 16)
        self.act = torch.nn.GELU()
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.proj(self.embed(input_ids))))  # type: ignore[no-any-return]


def schedule(variant: str) -> Any:
    def factor(step: int) -> float:
        if step < FAULT_STEP:
            return 1.0
        if variant == "linear":
            return 1.0 - step / (STEPS + 1)
        return 0.5 * (1.0 + math.cos(math.pi * step / (STEPS + 1)))

    return factor


def batches(variant: str) -> list[torch.Tensor]:
    ids = torch.randint(0, VOCAB, (STEPS + 1, ROWS, 8), generator=torch.Generator().manual_seed(1))
    steps = [ids[s] for s in range(STEPS)]
    if variant == "data":
        steps[FAULT_STEP] = ids[STEPS]
    return steps


def train(root: Path, variant: str, recording: dict[str, Any], fmt: str) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    state = {"step": 0}
    if variant == "layer":
        model.proj.register_forward_hook(lambda m, a, out: out * 1.01 if state["step"] >= FAULT_STEP else out)
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=0.01
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(variant))
    params = list(model.parameters())
    evidence = StepEvidence(params)
    with Recorder(root, format=fmt, **recording) as rec:
        rec.record_initial_params(model)
        for step, batch in enumerate(batches(variant)):
            state["step"] = step
            micro = [{"input_ids": part, "labels": part} for part in batch.chunk(MICRO)]
            rec.start(model)
            evidence.begin()
            total = torch.tensor(0.0)
            for part in micro:
                logits = model(part["input_ids"])
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, VOCAB), part["labels"].reshape(-1)
                )
                rec.record_output("logits", logits)
                rec.record_output("loss", loss)
                (loss / MICRO).backward()
                total = total + loss.detach() / MICRO
            evidence.grads_before_clip()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            evidence.grads_after_clip()
            lr, wd = group_settings(optimizer)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            rec.record_scalars(
                evidence.finish(
                    step,
                    loss=float(total),
                    lr=lr,
                    weight_decay=wd,
                    tokens=token_count(micro),
                    batch_hash=batch_hash(micro),
                    micro_batches=MICRO,
                    skipped=False,
                )
            )
            rec.stop()
            rec.step()


def main(out: Path, variants: list[str]) -> None:
    for variant in variants or VARIANTS:
        for name, recording in RECORDINGS.items():
            for fmt in ("native", "msprobe"):
                train(out / f"{variant}-{name}-{fmt}", variant, recording, fmt)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
