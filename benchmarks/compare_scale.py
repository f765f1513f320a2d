"""Compare time and memory at three sizes: how the offline compare of two tensor traces grows.

What it measures
    For each size of ``benchmarks/_shared.py`` (tiny, mid, large), two tensor-mode traces of
    one forward+backward of a randomly initialised Qwen2 (fp32, CPU, seed 0,
    ``labels=input_ids``), recorded with ``Recorder(model, mode="tensor")`` and written with
    ``write_trace`` (the native format: safetensors shards + records):

    * golden -- the original weights;
    * target -- ``model.layers.<L/2>.mlp.down_proj.weight`` perturbed by ``1e-3 * randn`` (seed 1).

    Then, interleaved over ``--rounds`` rounds after one discarded warm-up round (page cache
    warm), two variants, each in its own process so that its peak RSS is its own:

    * ``inproc`` -- ``pytest_precalign.run.offline.compare_runs(golden, target)``; the seconds
      are those of the call alone (imports and start-up excluded), the peak RSS the process's;
    * ``cli``    -- ``precalign compare <golden> <target> --report <out>`` (found beside the
      running interpreter, ``_commands.py``): wall seconds of the whole process.

    Both must name the perturbed layer as the forward first divergence (printed, and the
    script fails if not). Throughput = the tensor bytes of both sides / the in-process median.

Output
    A table (size, GB per side, records, in-process median s and GB/s, CLI median s, peak RSS
    of each, largest tensor) and, as the last line of stdout, one JSON object with ``sizes:
    {tiny: {...}, mid: {...}, large: {...}}`` (``trace_gb_per_side``, ``inproc_s``,
    ``inproc_gbps``, ``inproc_rss_mb``, ``cli_s``, ``cli_rss_mb``, ``largest_tensor_mb``,
    ``first_divergence``, ...), the load average and versions.

Reproduce (from the repository root; needs ~6 GB free in the temporary folder for large)::

    .venv/bin/python benchmarks/compare_scale.py                 # tiny, mid, large; 1 + 3 rounds
    .venv/bin/python benchmarks/compare_scale.py --size mid --rounds 5
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _commands import find_command
from _shared import SIZES, Size, build_qwen2, run_facts, summarize

from pytest_precalign.recording import HookRecorder as Recorder
from pytest_precalign.trace.native_io import write_trace

ORDER: tuple[str, ...] = ("tiny", "mid", "large")

# A child's ru_maxrss starts at its parent's RSS at fork (Linux keeps it across exec), so each
# measured command is started by this bare launcher, whose own RSS is small.
LAUNCHER = """
import json, os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"wall": time.perf_counter() - start, "cpu": usage.ru_utime + usage.ru_stime,
               "rss_kb": usage.ru_maxrss, "code": os.waitstatus_to_exitcode(status)}, f)
"""

# The in-process variant: only the compare_runs call is timed; its result goes to argv[3].
INPROC = """
import json, sys, time
from pytest_precalign.run.offline import compare_runs
start = time.perf_counter()
run = compare_runs(sys.argv[1], sys.argv[2])
seconds = time.perf_counter() - start
first = {str(p): getattr(v.first, "name", None) for p, v in run.verdicts.items()}
with open(sys.argv[3], "w") as f:
    json.dump({"seconds": seconds, "first": first}, f)
"""


@dataclass
class Child:
    wall: float
    cpu: float
    rss_mb: float
    code: int


def run_child(cmd: list[str], facts: Path) -> Child:
    """Run a command; its wall and CPU seconds and its own peak RSS."""
    subprocess.run([sys.executable, "-c", LAUNCHER, str(facts), *cmd], check=True)
    data = json.loads(facts.read_text())
    return Child(data["wall"], data["cpu"], data["rss_kb"] / 1024, data["code"])


def record_tensor(model: torch.nn.Module, ids: torch.Tensor, folder: Path) -> tuple[int, int, int]:
    """Write a tensor trace of one step; (tensor bytes, records, largest tensor bytes)."""
    model.zero_grad(set_to_none=True)
    with Recorder(model, mode="tensor") as rec:
        model(input_ids=ids, labels=ids).loss.backward()
    trace = rec.trace()
    write_trace(trace, folder)
    sizes = [t.numel() * t.element_size() for t in trace.tensors.values()]
    return sum(sizes), len(trace.records), max(sizes)


def build_pair(size: Size, folder: Path) -> dict[str, Any]:
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    model = build_qwen2(size, "sdpa")
    nbytes, records, largest = record_tensor(model, ids, folder / "golden")
    layer = size.layers // 2
    param = dict(model.named_parameters())[f"model.layers.{layer}.mlp.down_proj.weight"]
    with torch.no_grad():
        param.add_(1e-3 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    record_tensor(model, ids, folder / "target")
    del model
    gc.collect()
    return {"bytes": nbytes, "records": records, "largest": largest, "layer": f"model.layers.{layer}.mlp"}


def measure_size(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    folder = workdir / name
    shutil.rmtree(folder, ignore_errors=True)
    print(f"\n== size {name}: recording two tensor traces ...", flush=True)
    pair = build_pair(SIZES[name], folder)
    golden, target = str(folder / "golden"), str(folder / "target")
    precalign = find_command("precalign")
    load_start = os.getloadavg()[0]
    inproc: list[tuple[float, Child]] = []
    cli: list[Child] = []
    first: dict[str, Any] = {}
    for rnd in range(args.rounds + 1):  # round 0: discarded warm-up (page cache)
        out = folder / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        child = run_child(
            [sys.executable, "-c", INPROC, golden, target, str(out / "inproc.json")], out / "a.json"
        )
        result = json.loads((out / "inproc.json").read_text())
        first = result["first"]
        proc = run_child(
            [precalign, "compare", golden, target, "--report", str(out / "report")], out / "b.json"
        )
        if child.code != 0 or proc.code not in (0, 1):
            raise SystemExit(f"size {name}: compare failed (in-process {child.code}, CLI {proc.code})")
        if rnd:
            inproc.append((result["seconds"], child))
            cli.append(proc)
        print(
            f"  {'round ' + str(rnd) if rnd else 'warm-up':<8} in-process {result['seconds']:.3f}s "
            f"({child.rss_mb:.0f} MB)  cli {proc.wall:.3f}s ({proc.rss_mb:.0f} MB)",
            flush=True,
        )
    load_end = os.getloadavg()[0]
    found = first.get("forward")
    if found is None or not str(found).startswith(pair["layer"]):
        raise SystemExit(f"size {name}: the forward first divergence is {found!r}, not {pair['layer']}")
    shutil.rmtree(folder, ignore_errors=True)
    inproc_s = summarize([s for s, _ in inproc])[0]
    return {
        "trace_gb_per_side": round(pair["bytes"] / 1e9, 3),
        "records": pair["records"],
        "largest_tensor_mb": round(pair["largest"] / 2**20, 1),
        "inproc_s": round(inproc_s, 4),
        "inproc_min_s": round(min(s for s, _ in inproc), 4),
        "inproc_gbps": round(2 * pair["bytes"] / 1e9 / inproc_s, 3),
        "inproc_rss_mb": round(max(c.rss_mb for _, c in inproc)),
        "cli_s": round(summarize([c.wall for c in cli])[0], 4),
        "cli_cpu_s": round(summarize([c.cpu for c in cli])[0], 4),
        "cli_rss_mb": round(max(c.rss_mb for c in cli)),
        "first_divergence": found,
        "loadavg_start": round(load_start, 2),
        "loadavg_end": round(load_end, 2),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", choices=(*ORDER, "all"), default="all")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--workdir", help="where the traces are written (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = ORDER if args.size == "all" else (args.size,)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="precalign-compare-scale-", dir=args.workdir) as tmp:
        sizes = {name: measure_size(name, args, Path(tmp)) for name in names}
    load_end = os.getloadavg()[0]
    print(
        f"\n{'size':<6} {'GB/side':>8} {'records':>8} {'inproc s':>9} {'GB/s':>6} {'RSS MB':>7} "
        f"{'cli s':>7} {'RSS MB':>7} {'largest MiB':>12}"
    )
    for name, s in sizes.items():
        print(
            f"{name:<6} {s['trace_gb_per_side']:>8.3f} {s['records']:>8} {s['inproc_s']:>9.3f} "
            f"{s['inproc_gbps']:>6.2f} {s['inproc_rss_mb']:>7} {s['cli_s']:>7.3f} {s['cli_rss_mb']:>7} "
            f"{s['largest_tensor_mb']:>12.1f}"
        )
    print(f"1-min load average {load_start:.2f} at start, {load_end:.2f} at end ({os.cpu_count()} CPUs)")
    print(json.dumps({"sizes": sizes, "rounds": args.rounds, **run_facts(load_start, load_end)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
