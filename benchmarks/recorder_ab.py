"""A change to the recorder against an earlier commit's, in ONE process: the package at
``--ref`` is extracted (``git archive``) under another name, and a bare step, the earlier
recorder's step and the working tree's are interleaved round by round, so the machine's drift
(this 2-core VM's step time wanders by 10-20 % over minutes) falls on all three alike.

    .venv/bin/python benchmarks/recorder_ab.py --ref HEAD~1 --size py --rounds 40
    .venv/bin/python benchmarks/recorder_ab.py --ref HEAD~1 --size mid --rounds 10

``--size py``: the mid size's modules and records (582 a step) at hidden 32 on one thread,
``recorder_python.py``'s model: the recorder's Python, stable to a few tenths of a ms;
``--size mid`` (or any size of ``_shared.SIZES``): the full step, the statistics' memory
traffic and the cache effects included (+-5 ms). Each recorder is a stats-mode
``HookRecorder(model, mode="stats")`` (``--mode`` for another), built and entered inside the
timed region as ``recorder_overhead.py`` times it. Printed: each variant's median step and
median excess over the bare step of the same round, the median of (new - old) per round, and one
JSON object.

The package at ``--ref`` must import its own modules relatively (the recording and trace
packages do): it is imported as ``precalign_at_ref``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _shared import SIZES, Size, build_qwen2

import pytest_precalign.recording as current

ROOT = Path(__file__).resolve().parent.parent
PY_SIZE = dataclasses.replace(
    SIZES["mid"], vocab=256, hidden=32, intermediate=64, heads=2, kv_heads=1, batch=1, seq=8
)


def package_at(ref: str, folder: Path) -> Any:
    """The ``recording`` package of ``ref``, imported from ``folder`` as ``precalign_at_ref``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "src/pytest_precalign"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "src" / "pytest_precalign").rename(folder / "precalign_at_ref")
    sys.path.insert(0, str(folder))
    return importlib.import_module("precalign_at_ref.recording")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("--size", default="py", choices=["py", *sorted(SIZES)])
    parser.add_argument("--mode", default="stats", choices=["stats", "hash", "tensor"])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    size: Size = PY_SIZE if args.size == "py" else SIZES[args.size]
    if args.size == "py":
        torch.set_num_threads(1)
    model = build_qwen2(size, "sdpa")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        earlier = package_at(args.ref, Path(tmp))

        def recorded(package: Any) -> Callable[[], None]:
            def run() -> None:
                with package.HookRecorder(model, mode=args.mode):
                    model(input_ids=ids, labels=ids).loss.backward()

            return run

        variants: dict[str, Callable[[], None]] = {
            "bare": lambda: model(input_ids=ids, labels=ids).loss.backward(),
            "old": recorded(earlier),
            "new": recorded(current),
        }
        names = list(variants)
        times: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.rounds + 2):
            for name in names[round_ % 3 :] + names[: round_ % 3]:
                model.zero_grad(set_to_none=True)
                gc.collect()
                start = time.perf_counter()
                variants[name]()
                if round_ >= 2:  # two warm-up rounds
                    times[name].append(time.perf_counter() - start)
    out: dict[str, Any] = {"ref": args.ref, "size": args.size, "mode": args.mode, "rounds": args.rounds}
    for name in names:
        excess = statistics.median(v - b for v, b in zip(times[name], times["bare"], strict=True))
        out[f"{name}_ms"] = round(statistics.median(times[name]) * 1e3, 2)
        out[f"{name}_excess_ms"] = round(excess * 1e3, 2)
        print(f"{name:5s} {out[f'{name}_ms']:9.2f} ms   over bare {out[f'{name}_excess_ms']:7.2f} ms")
    change = statistics.median(n - o for n, o in zip(times["new"], times["old"], strict=True))
    out["new_minus_old_ms"] = round(change * 1e3, 2)
    print(f"new - old, median per round: {out['new_minus_old_ms']:+.2f} ms")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
