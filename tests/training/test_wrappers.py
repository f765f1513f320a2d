"""A model recorded inside a training wrapper records the names of the model inside it
(issue #25 item 10): DDP (gloo, one process), torch.compile, and a wrapper in a wrapper."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_lm import tiny_causal_lm  # noqa: E402


def tiny_qwen2() -> Any:
    return tiny_causal_lm(vocab=128, hidden=32, layers=2).eval()


def record_two_steps(model: Any, inner: Any, root: Path) -> None:
    """Two training steps of ``model`` (a wrapper or the bare model ``inner``), recorded."""
    from pytest_precalign import Recorder

    optimizer = torch.optim.SGD(inner.parameters(), lr=0.1)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    rec = Recorder(root, mode="tensor")
    for _ in range(2):
        with rec.recording(model):
            out = model(input_ids=ids, labels=ids)
            rec.record_output("loss", out.loss)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()


@pytest.fixture
def process_group() -> Iterator[None]:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def names(root: Path) -> set[str]:
    index = json.loads((root / "step0" / "rank0" / "index.json").read_text(encoding="utf-8"))
    records = index["records"] if isinstance(index, dict) else index
    return {r["name"] for r in records}


def wrappers(root: Path) -> list[str]:
    manifest = json.loads((root / "step0" / "rank0" / "manifest.json").read_text(encoding="utf-8"))
    found: list[str] = manifest.get("wrappers", [])
    return found


def test_ddp_wrapped_run_aligns_with_a_bare_one(tmp_path: Path, process_group: None) -> None:
    bare = tiny_qwen2()
    record_two_steps(bare, bare, tmp_path / "bare")
    inner = tiny_qwen2()
    ddp = torch.nn.parallel.DistributedDataParallel(inner)
    record_two_steps(ddp, inner, tmp_path / "ddp")

    assert wrappers(tmp_path / "ddp") == ["torch.nn.parallel.distributed.DistributedDataParallel"]
    assert wrappers(tmp_path / "bare") == []
    assert names(tmp_path / "ddp") == names(tmp_path / "bare")
    assert not any(n.startswith("module.") for n in names(tmp_path / "ddp"))
    assert main(["compare", str(tmp_path / "bare"), str(tmp_path / "ddp")]) == 0


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
# tensor mode under compile says its hooks split the graph (tests/recording/test_compiled_hash.py)
@pytest.mark.filterwarnings("ignore:the recorder's hooks run outside the compiled graph:UserWarning")
def test_compiled_model_records_the_inner_names(tmp_path: Path) -> None:
    bare = tiny_qwen2()
    record_two_steps(bare, bare, tmp_path / "bare")
    inner = tiny_qwen2()
    wrapped = torch.compile(inner, backend="eager")
    record_two_steps(wrapped, inner, tmp_path / "wrapped")

    assert [w.rsplit(".", 1)[-1] for w in wrappers(tmp_path / "wrapped")] == ["OptimizedModule"]
    assert names(tmp_path / "wrapped") == names(tmp_path / "bare")
    assert main(["compare", str(tmp_path / "bare"), str(tmp_path / "wrapped")]) == 0


def test_unwrap_leaves_other_modules_alone() -> None:
    from pytest_precalign.steps.unwrap import unwrap

    class DistributedDataParallel(torch.nn.Module):  # the user's own class of that name
        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Linear(2, 2)

    own = DistributedDataParallel()
    assert unwrap(own) == (own, ())
    assert os.environ.get("PYTEST_PRECALIGN_NEVER_SET") is None
