"""A user's own loop on a ``torch.compile``d model, recorded with ``pytest_precalign.Recorder``
(the documented ``start``/``stop``/``step`` calls), run as a script by the tests:

    python compiled_user_run.py OUT BACKEND [STEPS] [fault]

BACKEND: ``eager`` (not compiled), ``aot_eager`` or ``inductor``; STEPS: the recorded steps
(``0+2``; default all 3); ``fault``: the second block's activation has a wrong backward (its
grad scaled by 1.5; the forward as it was). Writes ``OUT/run`` (the recording) and ``OUT/facts.json``: dynamo's
graph and break counts, and each step's loss and grad-norm bits, recorded or not."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from pytest_precalign import Recorder

STEPS = 3


class _WrongGrad(torch.autograd.Function):
    """GELU whose backward scales its grad by 1.5 (a fault in one module's backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return grad * (cdf + x * pdf) * 1.5


class WrongGelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _WrongGrad.apply(x)  # type: ignore[no-untyped-call]
        return out


class Block(torch.nn.Module):
    def __init__(self, fault: bool = False) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.act: torch.nn.Module = WrongGelu() if fault else torch.nn.GELU()
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, fault: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.layers = torch.nn.ModuleList([Block(), Block(fault)])
        self.head = torch.nn.Linear(16, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def main(out: Path, backend: str, steps: list[int] | None, fault: bool = False) -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = TinyLM(fault)
    run = model if backend == "eager" else torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, 50, (STEPS, 4, 8), generator=torch.Generator().manual_seed(1))
    rec = Recorder(out / "run", mode="stats", steps=steps)
    bits = []
    for step in range(STEPS):
        rec.start(run)
        logits = run(data[step])
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), data[step][:, 1:].flatten())
        rec.record_output("loss", loss)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        rec.stop()
        rec.step()
        bits.append([loss.item().hex(), norm.item().hex()])
    rec.close()
    facts = {
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "bits": bits,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "facts.json").write_text(json.dumps(facts), encoding="utf-8")


if __name__ == "__main__":
    chosen = [int(s) for s in sys.argv[3].split("+")] if len(sys.argv) > 3 else None
    main(Path(sys.argv[1]), sys.argv[2], chosen, sys.argv[4:] == ["fault"])
