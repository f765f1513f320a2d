"""How much the same training step's wall time varies on this machine: the noise that
``training_overhead.py``'s paired ratios carry.

The mid step of ``training_overhead.py`` (``Run``), bare, ``--steps`` times in a row: the
standard deviation over the mean and the autocorrelation at lags 1-3 (how long a slow phase
lasts). Then ``--blocks`` blocks of ``--per-block`` steps, bare and scalars-recorded blocks
alternating (the first step of each block untimed, as ``training_overhead.py`` does): the
standard deviation inside a block against that of the blocks' means. When the block means
vary more than the steps inside a block predict, timing more steps per round does not help
and only more rounds do. Prints the figures and one JSON line. Writes nothing.

    .venv/bin/python benchmarks/step_noise.py --size mid --steps 30 --blocks 12
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _shared import SIZES, run_facts
from training_overhead import VARIANTS, Run


def _timed(run: Run, root: Path, variant: str, step: int) -> float:
    gc.collect()
    start = time.perf_counter()
    VARIANTS[variant](run, root, step)
    return time.perf_counter() - start


def _autocorrelation(values: list[float], lag: int) -> float:
    mean = statistics.mean(values)
    d = [v - mean for v in values]
    return sum(d[i] * d[i + lag] for i in range(len(d) - lag)) / sum(x * x for x in d)


def measure(size: str, steps: int, blocks: int, per_block: int) -> dict[str, Any]:
    load_start = os.getloadavg()[0]
    run = Run(SIZES[size])
    root = Path(tempfile.mkdtemp(prefix="precalign-step-noise-"))
    try:
        step = 0
        for _ in range(2):  # warm-up
            _timed(run, root, "bare", step)
            step += 1
        series = []
        for _ in range(steps):
            series.append(_timed(run, root, "bare", step))
            step += 1
        timed: dict[str, list[list[float]]] = {"bare": [], "scalars": []}
        for b in range(blocks):
            for variant in ("bare", "scalars") if b % 2 == 0 else ("scalars", "bare"):
                block = []
                for k in range(per_block + 1):
                    seconds = _timed(run, root, variant, step)
                    step += 1
                    if k:  # the block's first step is untimed
                        block.append(seconds)
                timed[variant].append(block)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mean = statistics.mean(series)
    out: dict[str, Any] = {
        "size": size,
        "steps": steps,
        "step_sd": statistics.stdev(series) / mean,
        "autocorrelation": {lag: round(_autocorrelation(series, lag), 3) for lag in (1, 2, 3)},
        "blocks": blocks,
        "per_block": per_block,
    }
    for variant, found in timed.items():
        means = [statistics.mean(b) for b in found]
        inside = statistics.mean(statistics.pvariance(b) for b in found) ** 0.5
        out[f"{variant}_inside_block_sd"] = inside / statistics.mean(means)
        out[f"{variant}_block_means_sd"] = statistics.stdev(means) / statistics.mean(means)
    return {**out, **run_facts(load_start, os.getloadavg()[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--per-block", type=int, default=2)
    args = parser.parse_args()
    if args.steps < 4 or args.blocks < 2 or args.per_block < 1:
        parser.error("--steps >= 4, --blocks >= 2 and --per-block >= 1")
    result = measure(args.size, args.steps, args.blocks, args.per_block)
    lags = ", ".join(f"lag {lag} {c:+.2f}" for lag, c in result["autocorrelation"].items())
    print(f"{args.steps} bare steps in a row: sd {result['step_sd']:.2%} of the mean; autocorrelation {lags}")
    for variant in ("bare", "scalars"):
        print(
            f"{variant:8s} blocks of {args.per_block}: sd inside a block {result[f'{variant}_inside_block_sd']:.2%},"
            f" sd of the block means {result[f'{variant}_block_means_sd']:.2%}"
        )
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
