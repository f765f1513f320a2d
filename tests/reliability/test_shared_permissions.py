"""Baselines, saved traces and msprobe dumps are shared things: every file and folder gets the
permissions the umask allows (a CI account reads what a user wrote), not the 0600/0700 of
mkstemp/mkdtemp."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_precalign.baseline.store import write_stored
from pytest_precalign.msprobe.writer import write_msprobe_dump
from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.native_io import write_trace
from pytest_precalign.trace.records import Trace


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _trace() -> Trace:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    rec = HookRecorder(model, mode="tensor")
    with rec:
        model(torch.randn(2, 4)).sum().backward()
    return rec.trace({"case": "t", "side": "candidate"})


def _private(root: Path) -> list[str]:
    """Entries that others cannot read (files) or enter (folders)."""
    bad = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        need = 0o055 if path.is_dir() else 0o044
        if mode & need != need:
            bad.append(f"{path.relative_to(root.parent)} {oct(mode)}")
    return bad


def test_everything_written_is_readable_by_others(tmp_path: Path, umask_022: None) -> None:
    trace = _trace()
    weights = {"0.weight": torch.ones(4, 4)}
    written = [
        write_trace(trace, tmp_path / "trace"),
        write_stored(trace, weights, tmp_path / "baselines" / "case", extra={"run_id": "t"}),
        write_msprobe_dump(trace, tmp_path / "dump"),
    ]
    for folder in written:
        assert folder.is_dir()
    assert _private(tmp_path / "trace") == []
    assert _private(tmp_path / "baselines") == []
    assert _private(tmp_path / "dump") == []


def test_a_stricter_umask_is_respected(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        target = write_trace(_trace(), tmp_path / "trace")
    finally:
        os.umask(old)
    modes = {stat.S_IMODE(p.stat().st_mode) & 0o077 for p in [target, *target.rglob("*")]}
    assert modes == {0}
