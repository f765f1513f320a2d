"""Recorder overhead: what one forward+backward step costs with and without a ``Recorder``,
at three model sizes, so the growth of the cost with the model can be read off.

What it measures
    One forward+backward of a randomly initialised ``transformers.Qwen2ForCausalLM``
    (fp32, CPU, ``torch.manual_seed(0)``, nothing downloaded) with ``labels=input_ids`` so
    the model's own cross-entropy loss is computed and back-propagated. Variants (``VARIANTS``,
    one line each):

    * ``none``   -- no recorder (the baseline);
    * ``stats``  -- ``Recorder(model, mode="stats", inputs=True, grads=True)``;
    * ``tensor`` -- ``Recorder(model, mode="tensor", ...)`` (detached copies kept in memory);
    * ``hash``   -- ``Recorder(model, mode="hash", ...)`` (CRC-32 of every tensor; extra);
    * ``tensor_disk`` -- the public ``pytest_precalign.Recorder`` in tensor mode writing the
      step's trace to a temporary folder through its background writer (``start`` .. step ..
      ``stop`` timed; the writer's queue bound, peak and waits reported).

    ``live_disk_ratio`` (mid size, unless ``--no-live``): disk written by full tensor mode over
    live mode (``Recorder(golden=...)``) on the mid model with one faulty layer, from
    ``benchmarks/live_compare.py``'s ``measure_live_disk`` (its origins reported too).

    The timed region is ``Recorder.__enter__`` .. forward .. ``loss.backward()`` ..
    ``Recorder.__exit__``. ``rec.trace()`` (which, in tensor mode, computes the stats of
    every kept tensor) is timed separately and reported as ``trace_finalize_<mode>_s``.
    Runs are interleaved round-robin over the variants (``--warmup`` rounds discarded, then
    ``--rounds`` measured rounds), the order shuffled each round (seeded); grads are set to
    ``None`` and a fresh ``Recorder`` is built before every run, and ``gc.collect()`` (and,
    after ``tensor_disk``, ``os.sync()``: its files written back before the next timed step)
    runs outside the timed region. Every run
    counts its tensor-to-Python conversions (``recording/host_sync.py``) from
    ``Recorder.__enter__`` to ``trace()``: the host synchronisations of one recorded step.

Sizes (``--size tiny|mid|qwen05|large|all``, ``benchmarks/_shared.py``)
    ``tiny``:  vocab 1000, hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads; batch 2, seq 32.
    ``mid``:   vocab 32000, hidden 512, intermediate 1408, 8 layers, 8 heads, 2 KV heads,
               untied embeddings; batch 2, seq 256.
    ``qwen05``: Qwen2.5-0.5B's layer shapes: hidden 896, intermediate 4864, 14 heads, 2 KV
               heads, 4 layers, vocab 32000; batch 2, seq 256.
    ``large``: vocab 32000, hidden 2048, intermediate 5504, 8 layers, 16 heads, 4 KV heads,
               untied embeddings (486M parameters); batch 1, seq 128. A tensor-mode step keeps
               about 2.4 GiB; a variant that keeps tensors in memory is skipped (reason in the
               JSON) when a stats-mode step's records add up to more than half of the memory
               available.
    Default rounds per size (``--warmup``/``--rounds`` override all): tiny 2 + 9, mid 2 + 7,
    qwen05 1 + 5, large 1 + 3 (a large step takes ~10 s on 2 cores: ``--size all`` takes about 5 minutes
    on a quiet machine).

Goals (issue 16, mid size, quiet machine)
    stats mode <= 1.05x the no-recorder median; tensor mode (in memory) <= 1.3x; host
    synchronisations per recorded step: 1, whatever the depth. For reference, msprobe on the
    same machine measured 1.7x (statistics, L0) and 3.4x (tensor, L0).

Output
    A table per size (variant, median s, min s, ratio, finalize s, records, MiB kept, host
    syncs per step), then, as the last line of stdout, one JSON object: the keys of the mid
    size (or of the only size run) at top level (``stats_ratio``, ``tensor_ratio``,
    ``hash_ratio``, ``host_syncs_per_step`` (the most over stats and hash mode),
    ``host_syncs_per_step_<mode>``, ``baseline_s``, ``<mode>_s``, ``<mode>_min_s``,
    ``trace_finalize_<mode>_s``, ``records_<mode>``, ``<mode>_mib``, ``skipped``, ...), every
    size's under ``sizes: {tiny: {...}, mid: {...}, large: {...}}``, and the run facts (load
    average at start and end, torch threads, versions).

Reproduce (from the repository root)::

    .venv/bin/python benchmarks/recorder_overhead.py --size all
    .venv/bin/python benchmarks/recorder_overhead.py --size mid --warmup 2 --rounds 9
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import transformers
from _shared import SIZES, Size, build_qwen2, run_facts, summarize

from pytest_precalign import Recorder as TrainingRecorder
from pytest_precalign.recording import HookRecorder as Recorder
from pytest_precalign.recording.host_sync import host_syncs
from pytest_precalign.trace.native_io import read_trace

ORDER: tuple[str, ...] = ("tiny", "mid", "qwen05", "large")
DEFAULT_ROUNDS: dict[str, tuple[int, int]] = {
    "tiny": (2, 9),
    "mid": (2, 7),
    "qwen05": (1, 5),
    "large": (1, 3),
}
SYNC_MODES: tuple[str, ...] = ("stats", "hash")  # the modes whose host syncs the goal counts


@dataclass
class RunResult:
    seconds: float
    finalize_seconds: float | None = None
    records: int | None = None
    kept_bytes: int | None = None  # tensors kept (in memory, or written) by the run
    host_syncs: int = 0
    recorded_bytes: int | None = None  # what the records' tensors add up to (dtype x shape)
    writer: dict[str, int] | None = None  # tensor_disk: the manifest's "writer" entry


Runner = Callable[[torch.nn.Module, torch.Tensor], RunResult]


def make_inputs(size: Size) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, size.vocab, (size.batch, size.seq), generator=gen)


def step(model: torch.nn.Module, ids: torch.Tensor) -> None:
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()


def run_bare(model: torch.nn.Module, ids: torch.Tensor) -> RunResult:
    start = time.perf_counter()
    step(model, ids)
    return RunResult(time.perf_counter() - start)


def run_recorder(mode: str, model: torch.nn.Module, ids: torch.Tensor) -> RunResult:
    syncs = host_syncs()
    rec = Recorder(model, mode=mode, inputs=True, grads=True)
    start = time.perf_counter()
    with rec:
        step(model, ids)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    trace = rec.trace()
    finalize = time.perf_counter() - start
    kept = sum(t.numel() * t.element_size() for t in trace.tensors.values())
    recorded = sum(_numel(r.shape) * _itemsize(r.dtype) for r in trace.records)
    return RunResult(seconds, finalize, len(trace.records), kept, host_syncs() - syncs, recorded)


def run_disk(model: torch.nn.Module, ids: torch.Tensor) -> RunResult:
    """Tensor mode through the public Recorder, written to disk by its background writer."""
    root = tempfile.mkdtemp(prefix="precalign-overhead-")
    try:
        syncs = host_syncs()
        rec = TrainingRecorder(root, mode="tensor", params=False)
        start = time.perf_counter()
        rec.start(model)
        step(model, ids)
        folder = rec.stop()
        seconds = time.perf_counter() - start
        syncs = host_syncs() - syncs
        assert folder is not None
        trace = read_trace(folder)
        written = sum(f.stat().st_size for f in folder.iterdir())
        return RunResult(seconds, 0.0, len(trace.records), written, syncs, None, trace.manifest.get("writer"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


# One line per variant; KEEPS_IN_MEMORY: the variants skipped when the kept tensors cannot fit.
VARIANTS: dict[str, Runner] = {
    "none": run_bare,
    "stats": partial(run_recorder, "stats"),
    "tensor": partial(run_recorder, "tensor"),
    "hash": partial(run_recorder, "hash"),
    "tensor_disk": run_disk,
}
KEEPS_IN_MEMORY: frozenset[str] = frozenset({"tensor"})
WRITES_TO_DISK: frozenset[str] = frozenset({"tensor_disk"})


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: str) -> int:
    return int(torch.empty((), dtype=getattr(torch, dtype)).element_size())


def run_once(model: torch.nn.Module, ids: torch.Tensor, variant: str) -> RunResult:
    model.zero_grad(set_to_none=True)
    gc.collect()
    result = VARIANTS[variant](model, ids)
    if variant in WRITES_TO_DISK:
        os.sync()  # its 637 MB reach the disk now, not during the next variant's timed step
    return result


def round_order(rnd: int) -> list[str]:
    """The variants of round ``rnd`` in an order shuffled by the round's number: what one
    variant leaves behind (freed memory to fault in again, a cache another's tensors evicted,
    the disk variant's written pages) falls on a different variant from round to round. (A
    rotation would not do: it keeps every variant's neighbours, so the bare run would always
    follow the disk variant, and stats mode always the bare run.)"""
    names = list(VARIANTS)
    random.Random(rnd).shuffle(names)
    return names


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (the memory a new allocation can take without swapping)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def memory_reason(recorded: int | None) -> str | None:
    """Why a variant keeping every recorded tensor in memory is skipped (None: it fits)."""
    if recorded is None:
        return None
    free = available_bytes()
    if recorded <= free // 2:
        return None
    return (
        f"would keep ~{recorded / 2**30:.1f} GiB of tensors in memory, "
        f"more than half of the {free / 2**30:.1f} GiB available"
    )


def measure_size(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds over the variants at one size; its table printed, its keys returned."""
    size = SIZES[name]
    warmup, rounds = DEFAULT_ROUNDS[name]
    warmup = warmup if args.warmup is None else args.warmup
    rounds = rounds if args.rounds is None else args.rounds
    model = build_qwen2(size, args.attn)
    ids = make_inputs(size)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"\n== size {name}: Qwen2ForCausalLM params={params / 1e6:.1f}M hidden={size.hidden} "
        f"layers={size.layers} batch={size.batch} seq={size.seq}; {warmup} warm-up + {rounds} rounds"
    )
    load_start = os.getloadavg()[0]
    results: dict[str, list[RunResult]] = {v: [] for v in VARIANTS}
    skipped: dict[str, str] = {}
    recorded: int | None = None  # bytes of one step's recorded tensors, from any recorder run
    first: dict[str, float] = {}  # each variant's first run in this process (setup included)
    for rnd in range(warmup + rounds):
        line = []
        for variant in round_order(rnd):
            if variant in skipped:
                continue
            if variant in KEEPS_IN_MEMORY:
                recorded = recorded or _probe_bytes(model, ids)
                reason = memory_reason(recorded)
                if reason is not None:
                    skipped[variant] = reason
                    print(f"  skipping {variant}: {reason}")
                    continue
            res = run_once(model, ids, variant)
            recorded = res.recorded_bytes or recorded
            line.append(f"{variant}={res.seconds:.3f}s")
            first.setdefault(variant, res.seconds)
            if rnd >= warmup:
                results[variant].append(res)
        label = f"round {rnd - warmup + 1}" if rnd >= warmup else f"warm-up {rnd + 1}"
        print(f"  {label:<10} " + "  ".join(line), flush=True)
    load_end = os.getloadavg()[0]
    del model
    gc.collect()
    keys = size_keys(results, skipped)
    # Setup paid once (issue #35: the first recorded step <= 2 s over a bare step): each
    # recorder's first step in this process, over the median bare step.
    keys["first_step_over_bare_s"] = {
        v: round(sec - keys["baseline_s"], 3) for v, sec in first.items() if v != "none"
    }
    keys.update(
        params_m=round(params / 1e6, 1),
        hidden=size.hidden,
        layers=size.layers,
        batch=size.batch,
        seq=size.seq,
        rounds=rounds,
        warmup=warmup,
        loadavg_start=round(load_start, 2),
        loadavg_end=round(load_end, 2),
    )
    print_table(name, results, keys)
    return keys


def _probe_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int | None:
    """Recorded bytes of one (untimed) stats-mode step, when no run has measured them yet."""
    model.zero_grad(set_to_none=True)
    return run_recorder("stats", model, ids).recorded_bytes


def paired_ratios(results: dict[str, list[RunResult]], variant: str) -> list[float]:
    """Per round, the variant's time over the bare run's of the same round (the rounds are
    interleaved, so both saw the same machine); a variant skipped in a round pairs nothing."""
    return [r.seconds / b.seconds for r, b in zip(results[variant], results["none"], strict=False)]


def size_keys(results: dict[str, list[RunResult]], skipped: dict[str, str]) -> dict[str, Any]:
    """The JSON keys of one size. ``<variant>_ratio`` is the median of the per-round paired
    ratios; a ratio under 1 (recording is a superset of the bare step's work) can only be
    noise, and is flagged in ``noise`` rather than quoted as a result."""
    base_median, base_min = summarize([r.seconds for r in results["none"]])
    keys: dict[str, Any] = {"baseline_s": round(base_median, 5), "baseline_min_s": round(base_min, 5)}
    noise: list[str] = []
    for variant, runs in results.items():
        if variant == "none" or not runs:
            continue
        median, minimum = summarize([r.seconds for r in runs])
        ratios = paired_ratios(results, variant)
        keys[f"{variant}_ratio"] = round(statistics.median(ratios), 4)
        keys[f"{variant}_ratio_range"] = [round(min(ratios), 4), round(max(ratios), 4)]
        if keys[f"{variant}_ratio"] < 1:
            noise.append(variant)
        keys[f"{variant}_s"] = round(median, 5)
        keys[f"{variant}_min_s"] = round(minimum, 5)
        keys[f"trace_finalize_{variant}_s"] = round(
            statistics.median(r.finalize_seconds or 0.0 for r in runs), 5
        )
        keys[f"records_{variant}"] = runs[-1].records
        keys[f"{variant}_mib"] = round((runs[-1].kept_bytes or 0) / 2**20, 1)
        keys[f"host_syncs_per_step_{variant}"] = max(r.host_syncs for r in runs)
    syncs = [keys[f"host_syncs_per_step_{m}"] for m in SYNC_MODES if f"host_syncs_per_step_{m}" in keys]
    keys["host_syncs_per_step"] = max(syncs) if syncs else None
    keys["skipped"] = dict(skipped)
    keys["noise"] = noise
    writer = results.get("tensor_disk") and results["tensor_disk"][-1].writer
    if writer:
        keys["tensor_disk_queue_mib"] = round(writer.get("queue_bytes", 0) / 2**20, 1)
        keys["tensor_disk_peak_queued_mib"] = round(writer.get("peak_queued_bytes", 0) / 2**20, 1)
        keys["tensor_disk_waits"] = writer.get("waits")
    return keys


def print_table(name: str, results: dict[str, list[RunResult]], keys: dict[str, Any]) -> None:
    print(
        f"\n{'size':<6} {'variant':<11} {'median s':>9} {'min s':>9} {'ratio':>7} {'finalize s':>11} "
        f"{'records':>8} {'MiB kept':>9} {'syncs/step':>10}"
    )
    for variant, runs in results.items():
        if not runs:
            print(f"{name:<6} {variant:<11} skipped: {keys['skipped'].get(variant, 'no run')}")
            continue
        median, minimum = summarize([r.seconds for r in runs])
        if variant == "none":
            print(
                f"{name:<6} {variant:<11} {median:>9.4f} {minimum:>9.4f} {1:>6.3f}x {'-':>11} {'-':>8} {'-':>9} {'-':>10}"
            )
            continue
        print(
            f"{name:<6} {variant:<11} {median:>9.4f} {minimum:>9.4f} {keys[f'{variant}_ratio']:>6.3f}x "
            f"{keys[f'trace_finalize_{variant}_s']:>11.4f} {keys[f'records_{variant}']:>8} "
            f"{keys[f'{variant}_mib']:>9.1f} {keys[f'host_syncs_per_step_{variant}']:>10}"
        )
    print(f"1-min load average: {keys['loadavg_start']:.2f} at start, {keys['loadavg_end']:.2f} at end")
    print("ratio: median over rounds of (variant / bare run of the same round)")
    print(
        "first step over the median bare step (setup included; goal <= 2 s): "
        + ", ".join(f"{v} {sec:+.3f}s" for v, sec in keys["first_step_over_bare_s"].items())
    )
    for variant in keys["noise"]:
        print(
            f"NOISE: {variant} measured {keys[f'{variant}_ratio']:.3f}x, under 1 for a superset of the "
            "bare step's work: the machine was too noisy for this figure; repeat on a quiet machine"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", choices=(*ORDER, "all"), default="all")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default: per size)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="discarded warm-up rounds (default: per size)"
    )
    parser.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    parser.add_argument(
        "--no-live", action="store_true", help="skip live_disk_ratio (benchmarks/live_compare.py)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave default)")
    args = parser.parse_args(argv)
    if (args.rounds is not None and args.rounds < 1) or (args.warmup is not None and args.warmup < 0):
        parser.error("--rounds must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    names = ORDER if args.size == "all" else (args.size,)
    print(
        f"recorder overhead, sizes {', '.join(names)}: fp32 cpu attn={args.attn} threads={torch.get_num_threads()} "
        f"torch={torch.__version__} transformers={transformers.__version__}; variants {', '.join(VARIANTS)}"
    )
    load_start = os.getloadavg()[0]
    sizes = {name: measure_size(name, args) for name in names}
    live: dict[str, Any] = {}
    if not args.no_live and "mid" in sizes:
        from live_compare import measure_live_disk

        live = measure_live_disk("mid")
        print(
            f"\nlive compare (mid, {live['fault']}): tensor mode {live['tensor_bytes'] / 2**20:.1f} MiB, "
            f"live {live['live_bytes'] / 2**20:.1f} MiB: {live['live_disk_ratio']}x less; "
            f"origin full {live['origin_full']}, live {live['origin_live']}"
        )
    load_end = os.getloadavg()[0]
    top = "mid" if "mid" in sizes else names[0]
    print(
        f"\n1-min load average over the run: {load_start:.2f} at start, {load_end:.2f} at end "
        f"(machine has {os.cpu_count()} CPUs)"
    )
    print(
        "goals (mid, quiet machine): stats <= 1.05x, tensor <= 1.30x, 1 host sync per recorded step, "
        "live compare >= 10x less disk than tensor mode with the same origin"
    )
    payload: dict[str, Any] = {
        **{k: v for k, v in sizes[top].items() if not k.startswith("loadavg")},
        "size": top,
        **(
            {
                "live_disk_ratio": live["live_disk_ratio"],
                "live_tensor_bytes": live["tensor_bytes"],
                "live_bytes": live["live_bytes"],
                "live_same_origin": live["origin_full"] == live["origin_live"],
            }
            if live
            else {}
        ),
        "attn": args.attn,
        "sizes": sizes,
        **run_facts(load_start, load_end),
    }
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
