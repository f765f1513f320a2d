"""Tensor mode's background writer (``recording/tensor_sink.py``) behind the public
``pytest_precalign.Recorder``: the trace it writes is the in-memory one, bit for bit; the
queue never holds more than its bound (the step waits instead, and the waits are counted);
a full disk is one clear error with nothing left behind; a writer killed with SIGKILL
mid-write leaves no trace folder, and the next run into the same root succeeds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from pytest_precalign import Recorder
from pytest_precalign.errors import ConfigError, TraceError
from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.tensor_summary import tensor_stats
from pytest_precalign.trace.native_io import begin_trace, read_trace, write_trace

REPO = Path(__file__).resolve().parents[2]
WRITER = "precalign-tensor-writer"


class _Net(nn.Module):
    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x)).transpose(0, 1).contiguous().transpose(0, 1)  # strided views
        return self.norm(x)


def _x(width: int = 8, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, width, generator=torch.Generator().manual_seed(1))


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).square().sum().backward()


def _hook_count(model: nn.Module) -> int:
    modules = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    params = sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())
    return modules + params


def _writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WRITER]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("queue_bytes", [256 << 20, 512], ids=["default-bound", "tiny-bound"])
def test_background_trace_is_bitwise_the_in_memory_one(tmp_path: Path, queue_bytes: int) -> None:
    background = Recorder(tmp_path / "bg", mode="tensor", params=False, queue_bytes=queue_bytes)
    model = _Net()
    background.start(model)
    _step(model, _x())
    folder = background.stop()
    assert folder == tmp_path / "bg" / "step0" / "rank0" and not _writers()

    model = _Net()
    with HookRecorder(model, mode="tensor") as rec:  # the in-memory path, unchanged
        _step(model, _x())
    kept = rec.trace()
    memory = write_trace(kept, tmp_path / "mem")

    got, want = read_trace(folder), read_trace(memory)
    assert len(got.records) > 20
    assert [r.as_dict() for r in got.records] == [r.as_dict() for r in want.records]
    for r in got.records:
        assert r.tensor_key is not None and r.stats is not None
        tensor = got.tensors[r.tensor_key]
        assert _bits(tensor) == _bits(want.tensors[r.tensor_key]), r.id
        # the stats taken at capture are the ones main took from the kept copies, bit for bit
        assert tensor_stats(kept.tensors[r.tensor_key]) == r.stats, r.id
    writer = got.manifest["writer"]
    assert writer["queue_bytes"] == queue_bytes
    shards = set(os.listdir(folder)) - {"index.json", "manifest.json", "checksums.json"}
    if queue_bytes > 1 << 20:
        assert len(shards) == 1
    else:
        assert len(shards) > 3 and writer["waits"] > 0  # a shard is at most the bound


def test_the_queue_never_holds_more_than_its_bound_and_the_step_waits(tmp_path: Path) -> None:
    model = _Net(width=8, depth=6)
    with HookRecorder(model, mode="tensor") as rec:
        _step(model, _x())
    trace = rec.trace()
    sizes = [t.numel() * t.element_size() for t in trace.tensors.values()]
    bound = 4 * max(sizes)
    assert sum(sizes) > 4 * bound  # the step's tensors do not fit in the queue
    waited = {}
    for name, queue_bytes in (("small", bound), ("large", 64 * sum(sizes))):
        recorder = Recorder(tmp_path / name, mode="tensor", params=False, queue_bytes=queue_bytes)
        model = _Net(width=8, depth=6)
        with recorder.recording(model):
            _step(model, _x())
        writer = read_trace(recorder.written[0]).manifest["writer"]
        assert 0 < writer["peak_queued_bytes"] <= queue_bytes
        waited[name] = writer["waits"]
    assert waited["small"] > 0 and waited["large"] == 0


def test_close_mid_step_stops_the_thread_and_removes_the_temporary_folder(tmp_path: Path) -> None:
    model = _Net()
    rec = Recorder(tmp_path / "run", mode="tensor", queue_bytes=256)
    rec.start(model)
    _step(model, _x())
    assert _writers() and _hook_count(model) > 0
    rec.close()  # the step's records are dropped
    assert not _writers() and _hook_count(model) == 0
    assert [p for p in (tmp_path / "run").rglob("*") if not p.is_dir()] == []
    with pytest.raises(RuntimeError, match="user code"), rec.recording(model):
        model(_x())
        raise RuntimeError("user code failed")
    assert not _writers() and _hook_count(model) == 0
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "run").rglob("*"))
    with rec.recording(model):
        _step(model, _x())
    assert not _writers() and read_trace(tmp_path / "run" / "step0" / "rank0").records


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (as in tests/reliability/test_foreign_errors.py)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("a tmpfs mount: Linux only")
    folder = tmp_path / "full"
    folder.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and mount): {exc}")
    yield folder
    subprocess.run(["umount", str(folder)], check=False, capture_output=True)


@pytest.mark.parametrize(("at", "level"), [("capture", "module"), ("capture", "op"), ("stop", "module")])
def test_a_full_disk_is_one_clear_error_and_leaves_nothing(full_disk: Path, at: str, level: str) -> None:
    model = _Net(width=64, depth=8)
    # A small bound: shards are written during the step and the disk fills before its end;
    # a bound above the step's bytes: the one shard is written at stop.
    bound = (64 << 10) if at == "capture" else (4 << 20)
    rec = Recorder(full_disk / "run", mode="tensor", level=level, queue_bytes=bound)
    folder = full_disk / "run" / "step0" / "rank0"
    rec.start(model)
    with pytest.raises(TraceError) as raised:
        _step(model, _x(width=64, batch=64))
        assert at == "stop" and _hook_count(model) > 0
        rec.stop()
    assert str(raised.value) == (
        f"{folder}: cannot write the trace's tensors: No space left on device "
        "(background writer; nothing was written, its temporary folder is removed)"
    )
    # no temp folder, and no empty run/step0/ made for it
    assert not _writers() and list(full_disk.rglob("*")) == []
    # the forward raised: the step was given up at once, op mode included (forward_guard.py)
    assert _hook_count(model) == 0 and not rec.recording_now and torch._C._len_torch_function_stack() == 0
    assert not folder.exists() and rec.stop() is None
    assert torch.equal(model(_x(width=64)), _Net(width=64, depth=8)(_x(width=64)))  # runs as before


def test_a_step_that_raises_leaves_no_folder_and_keeps_others(tmp_path: Path) -> None:
    model = _Net(width=64, depth=2)
    rec = Recorder(tmp_path / "run", mode="tensor")
    with rec.recording(model):
        _step(model, _x(width=64))
    assert (tmp_path / "run" / "step0" / "rank0" / "manifest.json").is_file()
    with pytest.raises(RuntimeError, match="boom"), rec.recording(model):
        _step(model, _x(width=64))
        raise RuntimeError("boom")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step0"]  # no empty step1/
    assert not _writers()


_CHILD = textwrap.dedent(
    """
    import sys, time, torch
    from pytest_precalign import Recorder

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4)))
    rec = Recorder(sys.argv[1], mode="tensor", queue_bytes=1 << 16)
    rec.start(model)
    x = torch.randn(32, 64)
    print("recording", flush=True)
    end = time.monotonic() + 120  # a long step: killed long before its end
    while time.monotonic() < end:
        model(x)
    rec.stop()
    """
)


def test_kill_9_mid_write_leaves_no_trace_and_the_next_run_succeeds(tmp_path: Path) -> None:
    root = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "recording"
        step = root / "step0"
        prefix = f".rank0.{socket.gethostname()}.{child.pid}."
        deadline = time.monotonic() + 60
        shards: list[Path] = []
        while len(shards) < 3 and time.monotonic() < deadline:  # shards are being written
            shards = list(step.glob(f"{prefix}*.tmp/tensors-*.safetensors"))
            time.sleep(0.05)
        assert len(shards) >= 3, "the child wrote no shards"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert not (step / "rank0").exists()  # only the dead writer's temporary folder
    assert (step / ".rank0.in-step").exists()  # the marker of the step the run stopped inside
    (stale,) = [p for p in step.iterdir() if p.name != ".rank0.in-step"]
    assert stale.name.startswith(prefix) and stale.name.endswith(".tmp")

    model = _Net()
    rec = Recorder(root, mode="tensor")
    with rec.recording(model):
        _step(model, _x())
    assert read_trace(step / "rank0").records
    assert sorted(p.name for p in step.iterdir()) == ["rank0"]  # the stale folder was removed


def test_temporary_folders_of_running_or_other_hosts_writers_are_kept(tmp_path: Path) -> None:
    target = tmp_path / "step0" / "rank0"
    target.parent.mkdir(parents=True)
    host = socket.gethostname()
    alive = target.parent / f".rank0.{host}.{os.getpid()}.abc.tmp"
    elsewhere = target.parent / ".rank0.another-host.1.abc.tmp"
    other_rank = target.parent / f".rank1.{host}.999999999.abc.tmp"
    for folder in (alive, elsewhere, other_rank):
        folder.mkdir()
    tmp = begin_trace(target)
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(
        [alive.name, elsewhere.name, other_rank.name, tmp.name]
    )


def test_queue_bytes_must_be_a_positive_integer(tmp_path: Path) -> None:
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ConfigError, match=r"queue_bytes= must be an integer >= 1"):
            Recorder(tmp_path, mode="tensor", queue_bytes=bad)  # type: ignore[arg-type]


def test_a_tensor_larger_than_the_bound_goes_alone_and_nothing_is_queued_after_close(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from pytest_precalign.recording.tensor_sink import TensorSink

    folder = tmp_path / ".t.tmp"
    folder.mkdir()
    sink = TensorSink(folder, target=tmp_path / "t", queue_bytes=64)
    small, big = torch.arange(8.0), torch.arange(100.0)  # 32 and 400 bytes
    for key, tensor in (("a", small), ("b", big), ("c", small.flip(0))):
        sink.put(key, tensor)
    shards = sink.close()
    assert not sink.running and set(shards) == {"a", "b", "c"}
    assert sink.peak_queued_bytes == 400 and sink.waits >= 1  # "b" waited for "a" to be written
    loaded = {k: v for file in set(shards.values()) for k, v in load_file(folder / file).items()}
    assert torch.equal(loaded["a"], small) and torch.equal(loaded["b"], big)
    assert torch.equal(loaded["c"], small.flip(0))
    with pytest.raises(TraceError, match="the background writer is closed"):
        sink.put("d", small)
