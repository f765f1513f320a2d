"""Runs of a tiny Qwen2 (seed 0) for the live-compare tests: a golden run, and candidates with
one faulty layer (one Linear's output scaled by 1.001 through a forward hook)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from pytest_precalign import Recorder
from pytest_precalign.run.offline import compare_runs
from tests.helpers.tiny_lm import tiny_causal_lm

FAULTY = "model.layers.1.mlp.down_proj"


def tiny_qwen2() -> torch.nn.Module:
    model: torch.nn.Module = tiny_causal_lm(vocab=100, hidden=32, layers=3, tie_word_embeddings=False)
    return model


def input_ids() -> torch.Tensor:
    return torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))


@contextmanager
def faulty(model: torch.nn.Module, name: str = FAULTY, scale: float = 1.001) -> Iterator[None]:
    """``name``'s output scaled by ``scale`` while inside (a hook added before the recorder's)."""
    module = model.get_submodule(name)
    handle = module.register_forward_hook(lambda m, args, out: out * scale)
    try:
        yield
    finally:
        handle.remove()


def record_step(model: torch.nn.Module, root: Path, **options: Any) -> Path:
    """One recorded forward + backward of ``model`` into ``root``; returns the rank folder."""
    rec = Recorder(root, params=False, **options)
    ids = input_ids()
    with rec.recording(model):
        out = model(input_ids=ids, labels=ids)
        rec.record_output("loss", out.loss)
        out.loss.backward()
    model.zero_grad(set_to_none=True)
    return rec.written[-1]


def origin(golden: Path, target: Path) -> tuple[str, str]:
    """(module, record name) of the case origin ``precalign compare`` names."""
    run = compare_runs(golden, target)
    for phase in run.phases:
        found = run.verdicts[phase].case_origin
        if found is not None:
            return found.module, found.record
    raise AssertionError(f"{golden} vs {target}: no divergence found")
