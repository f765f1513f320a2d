"""Stats-mode ``HookRecorder`` overhead as process CPU time on one torch thread: the measure a
loaded shared machine disturbs least (wall-clock ratios there are noise, see
``benchmarks/results/benchmarks.md``). One forward+backward of a ``benchmarks/_shared.py``
Qwen2 (``labels=input_ids``), bare and recorded (``mode="stats"``, inputs and grads),
interleaved; 2 warm-up pairs, then ``--rounds`` pairs. Printed: each pair's CPU seconds and
the median of the paired ratios (recorded / bare of the same round).

    .venv/bin/python benchmarks/recorder_cpu_time.py --size mid --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from _shared import SIZES, build_qwen2, run_facts

from pytest_precalign.recording import HookRecorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    torch.set_num_threads(1)
    size = SIZES[args.size]
    model = build_qwen2(size, "sdpa")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))

    def bare() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    def recorded() -> None:
        model.zero_grad(set_to_none=True)
        with HookRecorder(model, mode="stats", inputs=True, grads=True) as rec:
            model(input_ids=ids, labels=ids).loss.backward()
        rec.trace()

    pairs = []
    for r in range(2 + args.rounds):
        seconds = []
        for run in (bare, recorded):
            start = time.process_time()
            run()
            seconds.append(time.process_time() - start)
        if r >= 2:
            pairs.append(seconds)
            print(f"round {r - 1}: bare {seconds[0]:.3f} s, stats {seconds[1]:.3f} s CPU", flush=True)
    ratios = [s / b for b, s in pairs]
    result = {
        "size": args.size,
        "stats_cpu_ratio": round(statistics.median(ratios), 4),
        "stats_cpu_ratio_range": [round(min(ratios), 4), round(max(ratios), 4)],
        **run_facts(load_start, os.getloadavg()[0]),
    }
    print(f"stats mode, CPU time on one thread: {result['stats_cpu_ratio']:.3f}x bare (paired median)")
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
