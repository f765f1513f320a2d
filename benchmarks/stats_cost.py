"""Where stats mode's time goes inside a recorded step: the reductions, by tensor size.

What it measures
    One forward+backward of the mid (or ``--size``) ``transformers.Qwen2ForCausalLM`` from
    ``_shared.py`` (fp32, CPU, seed 0, ``labels=input_ids``) recorded with ``Recorder(model,
    mode="stats", inputs=True, grads=True)``, ``--rounds`` times after one warm-up. Every call
    of the step buffer's ``stats_vector`` (the statistics of one distinct recorded tensor:
    ``aminmax``, ``sum`` and ``vector_norm``, and the NaN/Inf counts when torch finds them
    needed) is timed with ``time.perf_counter`` around it; the step itself is timed as in
    ``recorder_overhead.py`` (enter .. forward .. backward .. exit).

Output
    Per round: the step's seconds, the seconds inside ``stats_vector``, the tensors and their
    MB. Then, for the last round, the time per tensor size (numel, count, ms in all, us each),
    largest first, and as the last line one JSON object (``step_s``, ``stats_vector_s``,
    ``tensors``, ``tensor_mb``, medians over the rounds, and ``by_numel`` of the last round).

Reproduce (from the repository root)::

    python benchmarks/stats_cost.py --size mid --rounds 5
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from _shared import SIZES, build_qwen2

from pytest_precalign.recording import step_buffer
from pytest_precalign.recording.recorder import Recorder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    model = build_qwen2(size, "sdpa")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    by_numel: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    original = step_buffer.stats_vector

    def timed(t: torch.Tensor, counts: Any = False) -> torch.Tensor:
        start = time.perf_counter()
        out = original(t, counts)
        entry = by_numel[t.numel()]
        entry[0] += 1
        entry[1] += time.perf_counter() - start
        return out

    step_buffer.stats_vector = timed  # type: ignore[assignment]
    rows = []
    try:
        for round_ in range(args.rounds + 1):
            by_numel.clear()
            model.zero_grad(set_to_none=True)
            gc.collect()
            rec = Recorder(model, mode="stats", inputs=True, grads=True)
            start = time.perf_counter()
            with rec:
                model(input_ids=ids, labels=ids).loss.backward()
            step = time.perf_counter() - start
            inside = sum(s for _, s in by_numel.values())
            count = int(sum(n for n, _ in by_numel.values()))
            mb = sum(numel * n * 4 for numel, (n, _) in by_numel.items()) / 1e6
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(
                f"{label:8s} step {step:.3f} s, stats_vector {inside * 1e3:.1f} ms over {count} tensors ({mb:.0f} MB)"
            )
            if round_:
                rows.append((step, inside, count, mb))
    finally:
        step_buffer.stats_vector = original
    print("\nlast round, by tensor size (numel, tensors, ms in all, us each):")
    last = sorted(by_numel.items(), key=lambda kv: -kv[1][1])
    for numel, (n, seconds) in last:
        print(f"  {numel:>10d}  {int(n):4d}  {seconds * 1e3:7.1f} ms  {seconds / n * 1e6:7.0f} us")
    result = {
        "size": args.size,
        "rounds": args.rounds,
        "step_s": round(statistics.median(r[0] for r in rows), 4),
        "stats_vector_s": round(statistics.median(r[1] for r in rows), 4),
        "tensors": rows[-1][2],
        "tensor_mb": round(rows[-1][3], 1),
        "by_numel": {str(k): [int(n), round(s, 5)] for k, (n, s) in last},
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
