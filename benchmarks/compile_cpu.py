"""The CPU seconds ``torch.compile`` spends compiling the recorded (stats mode) variant of a
Qwen2 step, and then the bare variant: process CPU time, which a loaded machine disturbs less
than the wall clock ``compile_overhead.py`` reports.

A ``Qwen2ForCausalLM`` of a ``benchmarks/_shared.py`` size (seed 0, fp32, CPU), batch 2 x 16
tokens; the first step runs inside a stats-mode ``HookRecorder`` (the hooks must be there before
the first compiled forward), so it compiles the variant with the in-graph statistics; the
second, unrecorded, compiles the variant without them. Each step is a forward and backward.
The last line is one JSON object. Compare two trees by their ``PYTHONPATH``, with inductor's
on-disk caches off (a graph compiled once before is otherwise read back from them):

    cd benchmarks && OMP_NUM_THREADS=1 TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 \
        python compile_cpu.py --size mid
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from _shared import SIZES, build_qwen2, run_facts

from pytest_precalign.recording import HookRecorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    torch.manual_seed(0)
    model = build_qwen2(SIZES[args.size], "sdpa")
    ids = torch.randint(0, SIZES[args.size].vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    run = torch.compile(model, backend=args.backend)

    def step() -> float:
        start = time.process_time()
        model.zero_grad(set_to_none=True)
        run(input_ids=ids, labels=ids).loss.backward()
        return time.process_time() - start

    with HookRecorder(run, mode="stats"):
        stats = step()
    bare = step()
    print(f"{args.size} {args.backend}: compile CPU s, stats variant {stats:.1f}, bare variant {bare:.1f}")
    result = {"size": args.size, "backend": args.backend, "stats_compile_cpu_s": round(stats, 1)}
    print(
        json.dumps(
            {**result, "bare_compile_cpu_s": round(bare, 1), **run_facts(load_start, os.getloadavg()[0])}
        )
    )


if __name__ == "__main__":
    main()
