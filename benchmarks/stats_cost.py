"""Where stats mode's time goes inside a recorded step: the reductions, by tensor size.

What it measures
    One forward+backward of the mid (or ``--size``) ``transformers.Qwen2ForCausalLM`` from
    ``_shared.py`` (fp32, CPU, seed 0, ``labels=input_ids``) recorded with ``Recorder(model,
    mode="stats", inputs=True, grads=True)``, ``--rounds`` times after one warm-up. Every
    statistics read of a distinct recorded CPU tensor (``stats_slots.StatsSlots.read``, as the
    recorder calls it: the C kernel's one read, or torch's reductions without one; reported
    under the key ``stats_vector``, its name when the step buffer computed them) is timed with
    ``time.perf_counter`` around it; the step itself is timed as in ``recorder_overhead.py``
    (enter .. forward .. backward .. exit).

Output
    Interleaved in each round: the step without a recorder (``bare``), recorded with every
    statistics read replaced by a constant (``hooks_only``: the hooks and bookkeeping without
    the reductions), and recorded as is (``stats``). Per round those seconds, the seconds
    inside the statistics reads, the tensors and their MB; the medians; for the last round the time
    per tensor size (numel, count, ms in all, us each), largest first; and as the last line one
    JSON object (``bare_s``, ``hooks_only_s``, ``stats_s``, ``stats_vector_s`` (medians),
    ``tensors``, ``tensor_mb``, ``by_numel`` of the last round, the load average).

Reproduce (from the repository root)::

    python benchmarks/stats_cost.py --size mid --rounds 5
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from _shared import SIZES, Read, build_qwen2, stats_reads

from pytest_precalign.recording import HookRecorder as Recorder
from pytest_precalign.trace.records import Stats


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    model = build_qwen2(size, "sdpa")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    by_numel: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0.0])

    def timed(read: Read) -> Read:
        def timed_read(t: torch.Tensor) -> Any:
            start = time.perf_counter()
            out = read(t)
            entry = by_numel[t.numel()]
            entry[0] += 1
            entry[1] += time.perf_counter() - start
            return out

        return timed_read

    def constant(read: Read) -> Read:
        zero = Stats(0.0, 0.0, 0.0, 0.0)
        return lambda t: zero

    def step(variant: str) -> float:
        model.zero_grad(set_to_none=True)
        gc.collect()
        rec = None
        if variant != "bare":
            with stats_reads(timed if variant == "stats" else constant):
                rec = Recorder(model, mode="stats", inputs=True, grads=True)
        start = time.perf_counter()
        if rec is None:
            model(input_ids=ids, labels=ids).loss.backward()
        else:
            with rec:
                model(input_ids=ids, labels=ids).loss.backward()
        return time.perf_counter() - start

    rows: dict[str, list[float]] = {"bare": [], "hooks_only": [], "stats": [], "stats_vector": []}
    for round_ in range(args.rounds + 1):
        by_numel.clear()
        seconds = {variant: step(variant) for variant in ("bare", "hooks_only", "stats")}
        inside = sum(s for _, s in by_numel.values())
        count = int(sum(n for n, _ in by_numel.values()))
        mb = sum(numel * n * 4 for numel, (n, _) in by_numel.items()) / 1e6
        label = "warm-up" if round_ == 0 else f"round {round_}"
        print(
            f"{label:8s} bare {seconds['bare']:.3f} s, hooks only {seconds['hooks_only']:.3f} s, "
            f"stats {seconds['stats']:.3f} s of which stats_vector {inside * 1e3:.1f} ms "
            f"over {count} tensors ({mb:.0f} MB)"
        )
        if round_:
            for variant, value in seconds.items():
                rows[variant].append(value)
            rows["stats_vector"].append(inside)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(
        f"\nmedians: bare {med['bare']:.3f} s; hooks only +{(med['hooks_only'] - med['bare']) * 1e3:.0f} ms; "
        f"stats +{(med['stats'] - med['bare']) * 1e3:.0f} ms, of which the reductions "
        f"(stats_vector) {med['stats_vector'] * 1e3:.0f} ms"
    )
    print("last round, by tensor size (numel, tensors, ms in all, us each):")
    last = sorted(by_numel.items(), key=lambda kv: -kv[1][1])
    for numel, (n, seconds_) in last:
        print(f"  {numel:>10d}  {int(n):4d}  {seconds_ * 1e3:7.1f} ms  {seconds_ / n * 1e6:7.0f} us")
    result = {
        "size": args.size,
        "rounds": args.rounds,
        "bare_s": round(med["bare"], 4),
        "hooks_only_s": round(med["hooks_only"], 4),
        "stats_s": round(med["stats"], 4),
        "stats_vector_s": round(med["stats_vector"], 4),
        "tensors": count,
        "tensor_mb": round(mb, 1),
        "by_numel": {str(k): [int(n), round(s, 5)] for k, (n, s) in last},
        "torch_threads": torch.get_num_threads(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
