"""What recording an FSDP2 (or DTensor TP) training step in stats mode costs, as a paired ratio
measured in one run.

A Qwen2ForCausalLM of a ``benchmarks/_shared.py`` size, ``fully_shard`` on each decoder layer and
on the root over 2 ranks (gloo, CPU, launched by this script through torchrun), AdamW, a
forward and backward of one batch per rank, ``clip_grad_norm_`` at 1.0. ``--wrap tp``: instead,
tensor parallelism over the 2 ranks (``parallelize_module``: q/k/v/gate/up ``ColwiseParallel``,
o/down ``RowwiseParallel`` in each layer, as ``example_suites/recorded_runs/tp_styles.py``'s
plain plan), both ranks on the same batch; the recorded step then also keeps each rank's
partial sums and local grad shards (``steps/tp_partials.py``), and the CPU seconds spent in the
grad-shard hooks (``tp_grad_shards``) are measured apart on rank 0 (their share of the bare
step's CPU). Variants, interleaved
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
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fsdp2_overhead.py --size mid --rounds 5 --wrap tp
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
    parser.add_argument("--wrap", default="fsdp2", choices=("fsdp2", "tp"))
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
    shard_hooks = [0.0, 0]  # CPU seconds in the TP grad-shard hooks on this rank, calls
    if options.wrap == "tp":
        _tensor_parallel(model, shard_hooks)
    else:
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seed = 0 if options.wrap == "tp" else rank  # TP ranks share the batch
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(seed))
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
        _clip(model, options.wrap == "tp")
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
    hook_cpu: list[float] = []  # rank 0's CPU seconds in the grad-shard hooks, a timed stats step
    hook_calls = 0  # the hooks' calls in a recorded step
    for r in range(options.rounds):
        order = ("bare", "stats") if r % 2 == 0 else ("stats", "bare")
        for variant in order:
            step(variant == "stats")  # untimed: what the other variant left behind falls here
            before = list(shard_hooks)
            wall, used = step(variant == "stats")
            times[variant].append(wall)
            cpu[variant].append(used)
            if variant == "stats":
                hook_cpu.append(shard_hooks[0] - before[0])
                hook_calls = shard_hooks[1] - before[1]
    ratios = [s / b for s, b in zip(times["stats"], times["bare"], strict=True)]
    cpu_ratios = [s / b for s, b in zip(cpu["stats"], cpu["bare"], strict=True)]
    if rank == 0:
        bare, stats = statistics.median(times["bare"]), statistics.median(times["stats"])
        what = "DTensor TP (Colwise/Rowwise per layer)" if options.wrap == "tp" else "FSDP2 per layer + root"
        print(f"size {options.size}, {options.rounds} rounds, 2 ranks (gloo, CPU), {what}")
        print(f"bare  {bare:.3f} s/step   stats {stats:.3f} s/step   ({stats / bare:.3f}x by medians)")
        print(
            f"paired stats/bare: median {statistics.median(ratios):.3f}x "
            f"(lowest {min(ratios):.3f}x, highest {max(ratios):.3f}x)"
        )
        print(
            f"CPU seconds of both ranks, paired stats/bare: median {statistics.median(cpu_ratios):.3f}x "
            f"(lowest {min(cpu_ratios):.3f}x, highest {max(cpu_ratios):.3f}x)"
        )
        share = statistics.median(hook_cpu) / (statistics.median(cpu["bare"]) / 2)  # of one rank's
        if options.wrap == "tp":
            print(
                f"TP grad-shard hooks on rank 0: {statistics.median(hook_cpu):.4f} s CPU a step "
                f"({hook_calls} calls), {100 * share:.2f} % of a rank's bare step CPU"
            )
        result = {
            "benchmark": "fsdp2_overhead",
            "wrap": options.wrap,
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
            "grad_shard_hooks_cpu_s": round(statistics.median(hook_cpu), 5),
            "grad_shard_hooks_share_of_bare_cpu": round(share, 5),
            **run_facts(load_start, os.getloadavg()[0]),
        }
        print(json.dumps(result))
    dist.destroy_process_group()


def _clip(model: Any, tp: bool) -> None:
    """Clip at 1.0 with the global grad norm (under TP some grads are DTensors and some are
    not, which ``clip_grad_norm_`` refuses: the full grads' norm, as ``sharded_loop.py``)."""
    if not tp:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm([getattr(g, "full_tensor", lambda g=g: g)() for g in grads])
    coef = torch.clamp(1.0 / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)


def _tensor_parallel(model: Any, shard_hooks: list[Any]) -> None:
    """``model``'s layers over a 2-rank mesh (the module doc's plan); the TP grad-shard hooks'
    CPU seconds and calls added up in ``shard_hooks``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from pytest_precalign.steps import tp_partials

    mesh = init_device_mesh("cpu", (2,))
    for layer in model.model.layers:
        col, row = ColwiseParallel, RowwiseParallel
        parallelize_module(layer.mlp, mesh, {"gate_proj": col(), "up_proj": col(), "down_proj": row()})
        attn = {"q_proj": col(), "k_proj": col(), "v_proj": col(), "o_proj": row()}
        parallelize_module(layer.self_attn, mesh, attn)  # type: ignore[arg-type]
    reader = tp_partials._grad_reader

    def timed_reader(calls: Any) -> Any:
        read = reader(calls)

        def timed(param: torch.Tensor) -> None:
            start = time.process_time()
            read(param)
            shard_hooks[0] += time.process_time() - start
            shard_hooks[1] += 1

        return timed

    tp_partials._grad_reader = timed_reader  # the benchmark's own stopwatch around the hook


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
