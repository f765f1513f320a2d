"""Recorder overhead per rank of a 4-rank data-parallel run (torchrun, gloo, CPU).

What it measures
    ``python -m torch.distributed.run --standalone --nproc-per-node N`` (the running
    interpreter's own torch, so no ``torchrun`` on PATH is needed) starts N workers of this
    script. Each builds the same randomly initialised Qwen2 (``benchmarks/_shared.py``, seed 0),
    wraps it in ``DistributedDataParallel`` (gloo, 1 torch thread per rank) and times one
    training step -- forward with the model's own loss on the rank's own batch (seed =
    rank), backward (DDP all-reduces the grads), ``SGD.step()`` -- with the public
    ``pytest_precalign.Recorder`` around it and without:

    * ``none``   -- no recorder;
    * ``stats``  -- ``Recorder(root, mode="stats")``: ``start(model)`` .. step .. ``stop()``;
    * ``tensor`` -- the same in tensor mode.

    The timed region runs from ``start`` to the end of ``stop`` (which records the parameters
    after the optimizer step and writes the rank's trace folder, atomically): the whole cost a
    training loop pays. Variants run round-robin (``--warmup`` rounds discarded); each run
    writes into a fresh folder, removed after it is measured. Every rank reports its median
    step time per variant, the ratio to its own ``none`` median, the host synchronisations of
    a recorded step (``recording/host_sync.py``, start .. stop) and the bytes written.

Output
    The launcher prints a table (rank x variant) and, as the last line of stdout, one JSON
    object: ``ranks`` (per rank: ``<variant>_s``, ``<variant>_ratio``, ``host_syncs_per_step_<mode>``,
    ``<mode>_bytes_written``), ``stats_ratio_max``/``tensor_ratio_max`` (the slowest rank),
    ``host_syncs_per_step`` (the most over ranks and modes), the load average and versions.

Reproduce (from the repository root)::

    .venv/bin/python benchmarks/recorder_ranks.py            # mid, 4 ranks, 1 + 3 rounds
    .venv/bin/python benchmarks/recorder_ranks.py --size tiny --rounds 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _shared import SIZES, run_facts, summarize

VARIANTS: tuple[str, ...] = ("none", "stats", "tensor")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def worker(args: argparse.Namespace) -> int:
    """One rank: interleaved timed training steps; its results to ``args.out/rank<R>.json``."""
    from _shared import build_qwen2
    from torch.nn.parallel import DistributedDataParallel

    from pytest_precalign import Recorder
    from pytest_precalign.recording.host_sync import host_syncs

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    size = SIZES[args.size]
    model = build_qwen2(size, "sdpa")
    ddp = DistributedDataParallel(model)
    optim = torch.optim.SGD(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=gen)
    out = Path(args.out)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    syncs: dict[str, int] = {}
    written: dict[str, int] = {}
    for rnd in range(args.warmup + args.rounds):
        for variant in VARIANTS:
            optim.zero_grad(set_to_none=True)
            gc.collect()
            root = out / f"trace-r{rank}-{rnd}-{variant}"
            rec = None if variant == "none" else Recorder(root, mode=variant)
            dist.barrier()  # every rank starts the variant together
            before = host_syncs()
            start = time.perf_counter()
            if rec is not None:
                rec.start(model)
            ddp(input_ids=ids, labels=ids).loss.backward()
            optim.step()
            path = rec.stop() if rec is not None else None
            seconds = time.perf_counter() - start
            if rnd >= args.warmup:
                times[variant].append(seconds)
            if path is not None:
                syncs[variant] = host_syncs() - before
                written[variant] = folder_bytes(path)
                shutil.rmtree(root)
    result: dict[str, Any] = {"rank": rank}
    base = summarize(times["none"])[0]
    for variant in VARIANTS:
        median, minimum = summarize(times[variant])
        result[f"{variant}_s"] = round(median, 4)
        result[f"{variant}_min_s"] = round(minimum, 4)
        if variant != "none":
            result[f"{variant}_ratio"] = round(median / base, 4)
            result[f"host_syncs_per_step_{variant}"] = syncs[variant]
            result[f"{variant}_bytes_written"] = written[variant]
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def launch(args: argparse.Namespace) -> int:
    size = SIZES[args.size]
    print(
        f"{args.nproc} ranks (torchrun, gloo, CPU, 1 thread each), DDP Qwen2 size={args.size} "
        f"hidden={size.hidden} layers={size.layers} batch={size.batch} seq={size.seq} per rank; "
        f"{args.warmup} warm-up + {args.rounds} rounds over {', '.join(VARIANTS)}",
        flush=True,
    )
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="precalign-ranks-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(args.nproc),
            __file__,
            "--worker",
            f"--out={tmp}",
            f"--size={args.size}",
            f"--rounds={args.rounds}",
            f"--warmup={args.warmup}",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
            print(f"torchrun failed with exit code {done.returncode}", file=sys.stderr)
            return 1
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(args.nproc)]
    load_end = os.getloadavg()[0]
    print(
        f"\n{'rank':>4} {'variant':<7} {'median s':>9} {'min s':>8} {'ratio':>7} {'syncs/step':>10} {'MiB written':>12}"
    )
    for r in ranks:
        for variant in VARIANTS:
            ratio = r.get(f"{variant}_ratio", 1.0)
            sync = r.get(f"host_syncs_per_step_{variant}", "-")
            mib = r.get(f"{variant}_bytes_written")
            mib_txt = f"{mib / 2**20:.1f}" if mib is not None else "-"
            print(
                f"{r['rank']:>4} {variant:<7} {r[f'{variant}_s']:>9.3f} {r[f'{variant}_min_s']:>8.3f} "
                f"{ratio:>6.3f}x {sync:>10} {mib_txt:>12}"
            )
    print(f"torchrun wall {wall:.1f} s; 1-min load average {load_start:.2f} at start, {load_end:.2f} at end")
    payload: dict[str, Any] = {
        "nproc": args.nproc,
        "size": args.size,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "ranks": ranks,
        "stats_ratio_max": max(r["stats_ratio"] for r in ranks),
        "tensor_ratio_max": max(r["tensor_ratio"] for r in ranks),
        "host_syncs_per_step": max(r[f"host_syncs_per_step_{v}"] for r in ranks for v in VARIANTS[1:]),
        "wall_s": round(wall, 1),
        **run_facts(load_start, load_end),
        "torch_threads": 1,
    }
    print(json.dumps(payload))
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--nproc", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="discarded warm-up rounds (default 1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0 or args.nproc < 1:
        parser.error("--rounds and --nproc must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    sys.exit(main())
