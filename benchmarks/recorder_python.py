"""The recorder's own Python, apart from the statistics' memory traffic: a Qwen2 with the mid
size's modules and records (8 layers, the same 582 records a step) but hidden 32, so the step's
kernels are tiny and a recorded step's extra time is the hooks' bookkeeping; stable to about
+-0.3 ms where the mid step's own time varies by +-20 ms.

    .venv/bin/python benchmarks/recorder_python.py --rounds 40

Variants, interleaved in each round after three warm-up rounds, ``gc.collect()`` before each
step (outside the timed region), torch on one thread: ``bare``; ``recorded``
(``HookRecorder(model, mode="stats")``); ``constant_stats`` (each CPU tensor's statistics
replaced by a constant: the bookkeeping alone); ``inactive`` (the hooks registered and
removed, doing nothing: torch's hook dispatch and our enter/exit); ``no_grads``
(``grads=False``: forward records only). Printed: each variant's median step and its median
excess over the bare step of the same round, in ms, and one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _shared import SIZES, Read, build_qwen2, stats_reads

from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.records import Stats

SHAPE = dataclasses.replace(
    SIZES["mid"], vocab=256, hidden=32, intermediate=64, heads=2, kv_heads=1, batch=1, seq=8
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_qwen2(SHAPE, "sdpa")
    ids = torch.randint(0, SHAPE.vocab, (SHAPE.batch, SHAPE.seq), generator=torch.Generator().manual_seed(0))

    def own(read: Read) -> Read:
        return read

    def constant(read: Read) -> Read:
        zero = Stats(0.0, 0.0, 0.0, 0.0)
        return lambda t: zero

    def recorded(options: dict[str, Any], stats: Callable[[Read], Read], active: bool) -> None:
        with stats_reads(stats), HookRecorder(model, mode="stats", **options) as rec:
            if active:
                model(input_ids=ids, labels=ids).loss.backward()
            else:
                with rec.paused():
                    model(input_ids=ids, labels=ids).loss.backward()

    variants: dict[str, Callable[[], None]] = {
        "bare": lambda: model(input_ids=ids, labels=ids).loss.backward(),
        "recorded": lambda: recorded({}, own, True),
        "constant_stats": lambda: recorded({}, constant, True),
        "inactive": lambda: recorded({}, own, False),
        "no_grads": lambda: recorded({"grads": False}, own, True),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds + 3):
        for name, run in variants.items():
            model.zero_grad(set_to_none=True)
            gc.collect()
            start = time.perf_counter()
            run()
            if round_ >= 3:
                times[name].append(time.perf_counter() - start)
    out: dict[str, Any] = {"rounds": args.rounds, "records": 582}
    for name, values in times.items():
        excess = statistics.median(v - b for v, b in zip(values, times["bare"], strict=True))
        out[f"{name}_ms"] = round(statistics.median(values) * 1e3, 2)
        out[f"{name}_excess_ms"] = round(excess * 1e3, 2)
        print(f"{name:15s} {out[f'{name}_ms']:7.2f} ms   over bare {out[f'{name}_excess_ms']:6.2f} ms")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
