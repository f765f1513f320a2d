"""Stored baselines on disk (baseline/store.py): a writer killed with SIGKILL mid-write leaves
the old baseline, recovery, and the environment and weights differences it names. The
--align-baseline life cycle end to end is in tests/integration/test_baseline.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.files import digest
from tests.helpers.paths import SRC

# -- SIGKILL during a baseline write ----------------------------------------------------------

WRITER = """
import sys, torch
from pathlib import Path

import pytest
from pytest_precalign.trace import native_io as trace_io
from pytest_precalign.baseline.store import write_stored
from pytest_precalign.trace.records import Record, Stats, Trace

trace_io.SHARD_BYTES = 4 << 20  # many shard files: a long write to interrupt
n, size, fill = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
records, tensors = [], {}
for i in range(n):
    key = f"t{i:04d}"
    tensors[key] = torch.full((size,), fill + i)
    records.append(Record(seq=i, name=f"layer{i}", module_class="Linear", phase="forward", step=0,
                          call=0, kind="activation", slot="out", dtype="float32", shape=(size,),
                          stats=Stats(0, 0, 0, 0), tensor_key=key))
trace = Trace(manifest={"case": "big", "side": "candidate", "record_mode": "tensor"},
              records=tuple(records), tensors=tensors)
print("writing", flush=True)
write_stored(trace, {"w": torch.ones(3)}, Path(sys.argv[1]) / "big", extra={})
print("done", flush=True)
"""


def _writer(root: Path, n: int, size: int, fill: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(n), str(size), str(fill)],
        env=env,
        stdout=subprocess.DEVNULL,
    )


def test_sigkill_mid_write_leaves_the_old_baseline(tmp_path: Path) -> None:
    from pytest_precalign.baseline.store import case_lock, recover
    from pytest_precalign.trace.native_io import read_trace

    old = _writer(tmp_path, 4, 1000, 1.0)
    assert old.wait(timeout=120) == 0
    target = tmp_path / "big"
    before = digest(target)

    # A new, larger write over it (48 shards of 4 MiB), killed once its temporary dir has shards.
    proc = _writer(tmp_path, 48, 1 << 20, 100.0)
    deadline = time.monotonic() + 120
    killed_mid_write = False
    while time.monotonic() < deadline and proc.poll() is None:
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(".big.pid") and p.name.endswith(".tmp")]
        if temps and len(list(temps[0].glob("tensors-*.safetensors"))) >= 2:
            os.kill(proc.pid, signal.SIGKILL)
            killed_mid_write = True
            break
        time.sleep(0.002)
    proc.wait(timeout=30)
    assert killed_mid_write, "the writer finished before it could be killed"
    assert proc.returncode == -signal.SIGKILL

    # The old baseline is byte-identical and loads; the dead writer's temp dir is still there.
    assert digest(target) == before
    trace = read_trace(target)
    assert len(trace.records) == 4 and float(trace.tensor(trace.records[3])[0]) == 4.0
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".big.pid")]
    assert leftovers and str(proc.pid) in leftovers[0]

    # The next run for this case removes it (its process is gone) and nothing else.
    (tmp_path / ".other.pid1.abc.tmp").mkdir()  # another case's: not ours to touch
    with case_lock(tmp_path, "big"):
        done = recover(tmp_path, "big")
    assert done == [f"removed {leftovers[0]} (left by killed process {proc.pid})"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".big.lock", ".other.pid1.abc.tmp", "big"]
    assert digest(target) == before


def test_a_baseline_moved_aside_but_not_replaced_is_restored(tmp_path: Path) -> None:
    from pytest_precalign.baseline.store import recover

    target = tmp_path / "case"
    target.mkdir()
    (target / "manifest.json").write_text('{"x": 1}')
    aside = tmp_path / ".case.q1w2e3.old"  # what publish_dir makes, killed between its renames
    aside.mkdir()
    os.replace(target, aside / "old")
    assert recover(tmp_path, "case") == ["restored case from .case.q1w2e3.old"]
    assert (target / "manifest.json").read_text() == '{"x": 1}' and not aside.exists()


def test_environment_diff_lists_what_changed() -> None:
    from pytest_precalign.baseline.store import environment_diff, weights_diff

    stored = {
        "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "4.49.0", "megatron-core": None},
        "device": "cpu",
        "dtype": "float32",
        "seed": 0,
        "determinism": {"requested": True, "deterministic_algorithms": True},
        "config_digest": "a" * 64,
        "weights": {"sha256": "1", "params": {"a": "x", "b": "y", "c": "z"}},
    }
    current = {
        **stored,
        "versions": {**stored["versions"], "transformers": "5.23.0", "megatron-core": "0.16.1"},
        "dtype": "bfloat16",
        "weights": {"sha256": "2", "params": {"a": "x", "b": "Y", "d": "w"}},
    }
    assert environment_diff(stored, current) == [
        "transformers 4.49.0 → 5.23.0",
        "megatron-core absent → 0.16.1",
        "dtype float32 → bfloat16",
    ]
    assert environment_diff(stored, stored) == []
    assert weights_diff(stored, current) == [
        "1 of 3 parameters differ: b",
        "1 baseline parameters absent from the candidate: c",
        "1 candidate parameters absent from the baseline: d",
    ]
    assert weights_diff(stored, stored) == []


def test_writable_without_statvfs_falls_back_to_the_access_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows has no ``os.statvfs``: the folder's permissions alone decide."""
    from pytest_precalign.baseline.store import writable

    monkeypatch.delattr(os, "statvfs")
    assert writable(tmp_path)
    assert not writable(tmp_path / "missing")
    if os.geteuid() != 0:  # root may write anywhere: only a non-root user sees a 0o555 folder refuse
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert not writable(locked)
