"""Small real recordings for the crafted-recording probes (``test_crafted_recordings.py``):
a hand-written loop recorded with the ``Recorder`` in-process (a 2-layer MLP, fixed seed,
milliseconds a step), and helpers that damage or craft them the way the tests say."""

from __future__ import annotations

import gc
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import torch

from pytest_precalign import Recorder
from tests.helpers.files import reseal

STEPS = 4


def record(
    root: Path,
    *,
    mode: str = "scalars",
    fmt: str = "native",
    steps: int = STEPS,
    stop_inside: int | None = None,
    nan_at: int | None = None,
    overwrite: bool = False,
    first: int = 0,
    continues: Path | None = None,
) -> Path:
    """A loop of ``steps`` optimizer steps recorded into ``root``. ``stop_inside``: the run
    ends inside that step, after its backward, as a killed run does (its recorder is dropped
    unclosed); ``nan_at``: that step's loss is NaN; ``first``: a run resumed at that step from
    a checkpoint (the steps before it trained unrecorded, then ``Recorder.seek``);
    ``continues``: the root its steps before ``first`` were recorded into."""
    _loop(root, mode, fmt, steps, stop_inside, nan_at, overwrite, first, continues)
    gc.collect()  # a killed run's recorder is gone with its process
    return root


def _loop(
    root: Path,
    mode: str,
    fmt: str,
    steps: int,
    stop_inside: int | None,
    nan_at: int | None,
    overwrite: bool,
    first: int,
    continues: Path | None = None,
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = torch.randn(steps, 3, 4, generator=torch.Generator().manual_seed(1))
    rec = Recorder(root, mode=mode, format=fmt, overwrite=overwrite)
    rec.seek(first, continues=continues)
    rec.record_settings(model, optimizer, steps=steps)  # a resumed loop too, as a callback does
    for step in range(steps):
        if step < first:  # the checkpoint's steps: trained before, not recorded now
            model(xs[step]).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            continue
        rec.start(model)
        loss = model(xs[step]).square().mean()
        if nan_at == step:
            loss = loss * float("nan")
        loss.backward()
        if stop_inside == step:
            _writer_killed(rec)
            return
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        optimizer.step()
        optimizer.zero_grad()
        rec.record_scalars(loss=loss.item(), grad_norm=float(norm), lr=[0.1])
        rec.stop()
        rec.step()
    rec.close()


def copied(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    return target


def manifest(root: Path, step: int = 0, name: str = "manifest.json") -> Path:
    return root / f"step{step}" / "rank0" / name


def edit_text(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))
    reseal(path)


def shard(root: Path, step: int = 0) -> Path:
    found = sorted((root / f"step{step}" / "rank0").glob("*.safetensors"))
    assert found, root
    return found[0]


def duplicate_in_safetensors_header(path: Path) -> None:
    """The first tensor's entry written twice into the header (the data is left as it is)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(data[8 : 8 + length])
    key = next(k for k in header if k != "__metadata__")
    entry = json.dumps({key: header[key]})[1:-1]
    text = "{" + entry + ", " + json.dumps(header)[1:]
    raw = text.encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])
    reseal(path)


def _writer_killed(rec: Recorder) -> None:
    """A killed process takes its tensor-mode writer thread with it: stop the thread here (in
    this process it would live on into the next test), leaving its temporary folder as a kill does."""
    sink = rec._sink
    if sink is not None:
        with sink._cond:
            sink._aborted = True
            sink._items.clear()
            sink._cond.notify_all()
        sink._thread.join()
