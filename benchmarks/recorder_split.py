"""Where a stats-mode recorded step's extra time goes: the recorder's hooks (their Python and
what they call) and, inside them, the statistics kernels, per step, beside the bare and the
recorded step's wall time (mid size unless ``--size``; interleaved rounds, the first dropped).

    .venv/bin/python benchmarks/recorder_split.py --size mid --rounds 6

Printed: the bare and recorded step's median wall time, the hooks' time per step (forward
hooks, grad hooks, parameter-grad hooks) and the statistics' (``stats_slots.StatsSlots.read``, a
device tensor's ``step_buffer.stats_vector``), ``enter_exit`` (registering and removing the
hooks, and the step's end: its records built) and ``recorder_ms`` (all of it), in ms; the difference between the recorded step and the bare one beyond the hooks is the
step's own kernels running slower after the reductions (caches) and noise.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _shared import SIZES, Read, build_qwen2, stats_reads

import pytest_precalign.recording.recorder as recorder
import pytest_precalign.recording.step_buffer as step_buffer
import pytest_precalign.recording.tensor_summary as tensor_summary
from pytest_precalign.recording import HookRecorder

HOOKS = {
    "forward_hooks": ("_pre_hook", "_post_hook", "_root_exit", "_root_enter"),
    "grad_hooks": ("_grad_output", "_grad_input"),
    "param_grad_hooks": ("_param_grad_hook",),
}
# Outside the step's hooks: registering and removing them, and the step's end (its records built).
ENDS = {"enter_exit": ("__enter__", "__exit__")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    size = SIZES[args.size]
    model = build_qwen2(size, "sdpa")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    spent: dict[str, float] = collections.defaultdict(float)
    depth = [0]

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            if depth[0]:
                return fn(*a, **k)
            depth[0] += 1
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label] += time.perf_counter() - start
                depth[0] -= 1

        return wrapper

    for label, names in (*HOOKS.items(), *ENDS.items()):
        for name in names:
            setattr(recorder.HookRecorder, name, timed(label, getattr(recorder.HookRecorder, name)))
    queued = tensor_summary.stats_vector

    def stats(t: torch.Tensor, counts: Any = False) -> torch.Tensor:
        start = time.perf_counter()
        try:
            return queued(t, counts)
        finally:
            spent["statistics"] += time.perf_counter() - start

    def timed_read(read: Read) -> Read:
        def timed_one(t: torch.Tensor) -> Any:
            start = time.perf_counter()
            try:
                return read(t)
            finally:
                spent["statistics"] += time.perf_counter() - start

        return timed_one

    setattr(step_buffer, "stats_vector", stats)  # what the step buffer calls (a device)  # noqa: B010
    bare: list[float] = []
    recorded: list[float] = []
    per_step: dict[str, list[float]] = collections.defaultdict(list)
    for r in range(args.rounds + 1):
        for variant in ("bare", "recorded") if r % 2 else ("recorded", "bare"):
            model.zero_grad(set_to_none=True)
            gc.collect()
            spent.clear()
            start = time.perf_counter()
            if variant == "bare":
                model(input_ids=ids, labels=ids).loss.backward()
            else:
                with stats_reads(timed_read), HookRecorder(model, mode="stats"):
                    model(input_ids=ids, labels=ids).loss.backward()
            seconds = time.perf_counter() - start
            if r == 0:
                continue
            (bare if variant == "bare" else recorded).append(seconds)
            if variant == "recorded":
                for label in (*HOOKS, *ENDS, "statistics"):
                    per_step[label].append(spent[label])
    out = {
        "size": args.size,
        "bare_ms": round(statistics.median(bare) * 1e3, 1),
        "recorded_ms": round(statistics.median(recorded) * 1e3, 1),
        **{f"{label}_ms": round(statistics.median(v) * 1e3, 1) for label, v in per_step.items()},
    }
    hooks = sum(out[f"{label}_ms"] for label in HOOKS)
    out["hooks_ms"] = round(hooks, 1)
    out["hooks_without_statistics_ms"] = round(hooks - out["statistics_ms"], 1)
    out["recorder_ms"] = round(hooks + out["enter_exit_ms"], 1)  # all the recorder's own time
    print(json.dumps(out))


if __name__ == "__main__":
    main()
