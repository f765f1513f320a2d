"""A user's PyTorch Lightning run on a ``torch.compile``d LightningModule (given to
``Trainer.fit``), with or without ``PrecalignLightningCallback`` (stats mode, steps 1 and 2),
run as a script by the tests:

    python lightning_compiled_run.py OUT BACKEND callback|bare

Writes ``OUT/run`` (the recording, with the callback) and ``OUT/facts.json``: dynamo's graph
and break counts and every micro-batch's loss as ``training_step`` returned it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pytest_precalign import PrecalignLightningCallback  # noqa: E402
from tests.training.lightning_run import QUIET, Module, Rows  # noqa: E402


def main(out: Path, backend: str, with_callback: bool) -> None:
    torch.manual_seed(0)
    module = Module("llm", 0.05, 3)
    compiled = torch.compile(module, backend=backend)
    callbacks = [PrecalignLightningCallback(out / "run", mode="stats", steps=[1, 2])] if with_callback else []
    trainer = L.Trainer(max_steps=3, callbacks=callbacks, **QUIET)
    trainer.fit(compiled, DataLoader(Rows("llm", 12), batch_size=2))  # type: ignore[arg-type]
    facts = {
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "losses": [x.hex() for x in module.seen["micro_losses"]],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "facts.json").write_text(json.dumps(facts), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "callback")
