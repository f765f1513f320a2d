"""A user's ``transformers.Trainer`` run with ``TrainingArguments(torch_compile=True)``, with or
without ``PrecalignCallback`` (stats mode, steps 1 and 2), run as a script by the tests:

    python hf_compiled_run.py OUT BACKEND callback|bare

Writes ``OUT/run`` (the recording, with the callback) and ``OUT/facts.json``: dynamo's graph
and break counts and the loss and grad norm the Trainer logged at each step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from torch._dynamo.utils import counters

from pytest_precalign import PrecalignCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.tiny_lm import tiny_causal_lm  # noqa: E402


def main(out: Path, backend: str, with_callback: bool) -> None:
    model = tiny_causal_lm()
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 128, (16,), generator=generator).tolist() for _ in range(8)]
    args = transformers.TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=2,
        max_steps=3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        torch_compile=True,
        torch_compile_backend=backend,
    )
    callbacks = [PrecalignCallback(out / "run", mode="stats", steps=[1, 2])] if with_callback else []
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=[{"input_ids": r, "labels": r} for r in rows],
        data_collator=transformers.default_data_collator,
        callbacks=callbacks,
    )
    trainer.train()
    logged = [(e["loss"], e["grad_norm"]) for e in trainer.state.log_history if "loss" in e]
    facts = {
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "logged": logged,
    }
    (out / "facts.json").write_text(json.dumps(facts), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "callback")
