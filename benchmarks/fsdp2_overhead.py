"""What recording an FSDP2 training step in stats mode costs, as a paired ratio measured in one run.

A Qwen2ForCausalLM of a ``benchmarks/_shared.py`` size, ``fully_shard`` on each decoder layer and
on the root over 2 ranks (gloo, CPU, launched by this script through torchrun), AdamW, a
forward and backward of one batch per rank, ``clip_grad_norm_`` at 1.0. Variants, interleaved
round by round on the same model and optimizer (the machine's load drifts alike for both), the
order swapped every round:

- ``bare``: the step alone;
- ``stats``: the same step recorded with ``Recorder(mode="stats")`` (``start``/``stop``, every
  layer's activations, grads, param grads and params; DTensor param grads and params combined
  over the mesh once per step, ``recording/sharded_stats.py``) and ``StepEvidence``.

Each variant takes two steps in a row and only the second is timed (wall clock between two
barriers, so the slower rank's time), as in ``training_overhead.py``. Printed: the median
seconds per step of each variant, the paired ratios stats / bare of the same round (median,
lowest, highest), and the same of the CPU seconds both ranks' processes used in the step
(which a loaded machine disturbs less than the wall clock); the last line is one JSON object.
Goal (issue #45): stats <= 1.1x bare.

    .venv/bin/python benchmarks/fsdp2_overhead.py --size mid --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", default="mid")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="instead of timing: cProfile N recorded steps on rank 0, print the top N functions by own time",
    )
    options = parser.parse_args(argv)
    if "RANK" not in os.environ:  # launch ourselves on 2 ranks
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        raise SystemExit(subprocess.call([*cmd, __file__, *argv]))
    run(options)


def run(options: argparse.Namespace) -> None:
    from _shared import SIZES, build_qwen2, run_facts
    from torch.distributed.fsdp import fully_shard

    from pytest_precalign import Recorder
    from pytest_precalign.steps.step_evidence import StepEvidence, group_settings

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    size = SIZES[options.size]
    load_start = os.getloadavg()[0]
    model: Any = build_qwen2(size, "sdpa")
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(rank))
    root = Path(tempfile.mkdtemp(prefix="fsdp2_overhead_"))
    rec = Recorder(root / "rec", mode="stats")
    evidence = StepEvidence(model.parameters())

    def step(recorded: bool) -> tuple[float, float]:
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        if recorded:
            rec.start(model)
            evidence.begin()
        out = model(input_ids=ids, labels=ids)
        if recorded:
            rec.record_output("loss", out.loss)
        out.loss.backward()
        if recorded:
            evidence.grads_before_clip()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if recorded:
            evidence.grads_after_clip()
            lr, wd = group_settings(optimizer)
        optimizer.step()
        optimizer.zero_grad()
        if recorded:
            rec.record_scalars(
                evidence.finish(rec.current_step, loss=float(out.loss.detach()), lr=lr, weight_decay=wd)
            )
            rec.stop()
            rec.step()
        used = torch.tensor([time.process_time() - cpu], dtype=torch.float64)
        dist.barrier()
        wall = time.perf_counter() - start
        dist.all_reduce(used)  # both ranks' CPU seconds (outside the timed wall clock)
        return wall, float(used)

    step(False)  # warm-up: first steps build kernels and allocate
    step(True)
    if options.profile:
        _profile(step, rank, options.profile)
        dist.destroy_process_group()
        return
    times: dict[str, list[float]] = {"bare": [], "stats": []}
    cpu: dict[str, list[float]] = {"bare": [], "stats": []}
    for r in range(options.rounds):
        order = ("bare", "stats") if r % 2 == 0 else ("stats", "bare")
        for variant in order:
            step(variant == "stats")  # untimed: what the other variant left behind falls here
            wall, used = step(variant == "stats")
            times[variant].append(wall)
            cpu[variant].append(used)
    ratios = [s / b for s, b in zip(times["stats"], times["bare"], strict=True)]
    cpu_ratios = [s / b for s, b in zip(cpu["stats"], cpu["bare"], strict=True)]
    if rank == 0:
        bare, stats = statistics.median(times["bare"]), statistics.median(times["stats"])
        print(f"size {options.size}, {options.rounds} rounds, 2 ranks (gloo, CPU), FSDP2 per layer + root")
        print(f"bare  {bare:.3f} s/step   stats {stats:.3f} s/step   ({stats / bare:.3f}x by medians)")
        print(
            f"paired stats/bare: median {statistics.median(ratios):.3f}x "
            f"(lowest {min(ratios):.3f}x, highest {max(ratios):.3f}x)"
        )
        print(
            f"CPU seconds of both ranks, paired stats/bare: median {statistics.median(cpu_ratios):.3f}x "
            f"(lowest {min(cpu_ratios):.3f}x, highest {max(cpu_ratios):.3f}x)"
        )
        result = {
            "benchmark": "fsdp2_overhead",
            "size": options.size,
            "rounds": options.rounds,
            "bare_s": round(bare, 4),
            "stats_s": round(stats, 4),
            "paired_ratio_median": round(statistics.median(ratios), 4),
            "paired_ratio_min": round(min(ratios), 4),
            "paired_ratio_max": round(max(ratios), 4),
            "bare_cpu_s": round(statistics.median(cpu["bare"]), 4),
            "stats_cpu_s": round(statistics.median(cpu["stats"]), 4),
            "paired_cpu_ratio_median": round(statistics.median(cpu_ratios), 4),
            "paired_cpu_ratio_min": round(min(cpu_ratios), 4),
            "paired_cpu_ratio_max": round(max(cpu_ratios), 4),
            **run_facts(load_start, os.getloadavg()[0]),
        }
        print(json.dumps(result))
    dist.destroy_process_group()


def _profile(step: Any, rank: int, top: int) -> None:
    """cProfile 3 bare and 3 recorded steps on rank 0 (rank 1 runs them unprofiled); print the
    functions whose own CPU time the recorded steps add most, per step."""
    import cProfile
    import pstats

    # timed by CPU time: the machine's load does not add to a function's time
    profilers = {v: cProfile.Profile(time.process_time) for v in ("bare", "stats")}
    for _ in range(3):
        for variant, profiler in profilers.items():
            step(variant == "stats")  # untimed, as in the timed rounds
            if rank == 0:
                profiler.enable()
            step(variant == "stats")
            if rank == 0:
                profiler.disable()
    if rank != 0:
        return
    own: dict[str, dict[Any, tuple[int, float, float]]] = {}
    for variant, profiler in profilers.items():
        table = pstats.Stats(profiler).strip_dirs().stats  # type: ignore[attr-defined]
        own[variant] = {fn: (row[1], row[2], row[3]) for fn, row in table.items()}
    for column, title in ((1, "own"), (2, "cumulative")):
        added = sorted(
            own["stats"],
            key=lambda fn: own["stats"][fn][column] - own["bare"].get(fn, (0, 0.0, 0.0))[column],
            reverse=True,
        )
        print(f"{title + ' s/step added':>24} {'calls/step added':>16}  function")
        for fn in added[:top]:
            calls, base = own["stats"][fn][0], own["bare"].get(fn, (0, 0.0, 0.0))
            seconds = (own["stats"][fn][column] - base[column]) / 3
            print(f"{seconds:24.4f} {(calls - base[0]) / 3:16.0f}  {fn[2]} ({fn[0]}:{fn[1]})")
    total = {v: sum(r[1] for r in own[v].values()) / 3 for v in own}
    print(f"profiled own time per step: bare {total['bare']:.3f} s, stats {total['stats']:.3f} s")
    print(
        f"the recorder's own code, per recorded step: {_recorder_seconds(profilers['stats']) / 3:.4f} s CPU"
    )


def _recorder_seconds(profiler: Any) -> float:
    """CPU seconds spent inside ``pytest_precalign`` (with the torch calls it makes): the
    cumulative time of each of its functions called from outside it (the benchmark's calls, the
    hooks torch calls), so that nothing is counted twice. Unlike the whole step's time, the
    machine's load barely moves it (the model's kernels are not in it)."""
    import pstats

    table = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    ours = "pytest_precalign"
    seconds = 0.0
    for fn, (_, _, _, _, callers) in table.items():
        if ours not in fn[0]:
            continue
        seconds += sum(row[3] for caller, row in callers.items() if ours not in caller[0])
    return seconds


if __name__ == "__main__":
    main(sys.argv[1:])
