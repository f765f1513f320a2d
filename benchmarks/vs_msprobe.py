"""pytest-precalign vs msprobe (mindstudio-probe), side by side in one run.

What it measures (mid Qwen2 by default: hidden 512, 8 layers, 8 heads, 2 KV heads,
intermediate 1408, vocab 32000, batch 2, seq 256, fp32, sdpa, CPU; random weights from seed 0,
nothing downloaded; one step = forward with ``labels=input_ids`` + ``loss.backward()``):

1. Recorder overhead, interleaved round-robin in this process: no recorder, ``stats``,
   ``tensor`` (kept in memory), level ``op`` and level ``mix`` (both in stats mode). Timed:
   building the ``Recorder``, entering it, the step, leaving it (``trace()`` is not timed).
   msprobe's ``PrecisionDebugger`` is a process-wide singleton and patches torch's APIs, so each
   msprobe config (statistics L0, tensor L0, statistics mix) runs in its own child process of
   this script, which times ``start() .. step .. stop()`` (stop writes dump.json) interleaved
   with plain steps in that same process; the ratio is to those plain steps.
2. Tensor mode to disk: a tensor-mode trace of one step written with ``write_trace`` (page
   cache, then with every file fsync'ed), next to ``dd`` writing as many bytes to the same
   folder (``bs=1M``, without and with ``conv=fdatasync``).
3. Offline compare of two msprobe tensor dumps (golden, and a target with a perturbed
   ``down_proj`` weight in the middle layer), written by our msprobe writer:
   ``precalign compare GOLDEN TARGET`` vs ``msprobe compare -tp TARGET -gp GOLDEN``, both CLI
   child processes, interleaved; wall time, CPU time and peak RSS of each child
   (``os.wait4``), at two dump sizes (seq 256 and 64). ``compare_gbps`` = fp32 bytes of both
   sides / precalign's CPU seconds (GB/s per busy core). In the same rounds, ``compare_runs``
   in this process (just the compare): ``compare_inproc_gbps`` = those bytes / its median wall
   time, and ``compare_bandwidth_fraction`` = that / ``probe_gbps``, the machine's own bandwidth
   (``bandwidth_probe.py``: numpy max |a - b| of two 512 MiB fp32 arrays, the better of before
   and after the compares). Goals: fraction >= 0.5, ``compare_speedup_vs_msprobe`` >= 20.
4. ``pytest --co`` on a dummy test folder with the plugin installed but unused vs
   ``-p no:precalign``: ``plugin_import_ms`` = difference of the medians.

Goals: stats <= 1.10x, tensor <= 1.5x, op <= 2x (msprobe measured 1.7x statistics L0, 2.8x
mix, 3.4x tensor L0 on this machine), plugin_import_ms <= 50.

Output: a Markdown table (for the README), then as the LAST line one JSON object
(``stats_ratio``, ``tensor_ratio``, ``op_ratio``, ``mix_ratio``, ``msprobe_stats_ratio``,
``msprobe_tensor_ratio``, ``msprobe_mix_ratio``, ``write_gbps``, ``dd_gbps``,
``compare_speedup_vs_msprobe``, ``compare_gbps``, ``compare_bandwidth_fraction``, ``probe_gbps``,
``compare_peak_rss_mb``,
``plugin_import_ms``, load averages, versions, ...).

Reproduce (from the repository root, ~10 min on 2 cores; needs ~4 GB free in --workdir)::

    . .venv/bin/activate && pip install -e '.[bench]'
    python benchmarks/vs_msprobe.py            # or --quick for a smaller run (~3 min)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from _commands import find_command
from _shared import SIZES, Size, build_qwen2, run_facts
from bandwidth_probe import bandwidth_probe

from pytest_precalign.msprobe import write_msprobe_dump
from pytest_precalign.recording import HookRecorder as Recorder
from pytest_precalign.run.offline import compare_runs
from pytest_precalign.trace.native_io import write_trace
from pytest_precalign.trace.records import Trace

HERE = Path(__file__).resolve().parent
RECORDER_VARIANTS: dict[str, tuple[str, str] | None] = {
    "none": None,
    "stats": ("stats", "module"),
    "tensor": ("tensor", "module"),
    "op": ("stats", "op"),
    "mix": ("stats", "mix"),
}
MSPROBE_CONFIGS = {
    "msprobe_stats": ("statistics", "L0"),
    "msprobe_tensor": ("tensor", "L0"),
    "msprobe_mix": ("statistics", "mix"),
}
GOALS = {"stats": 1.10, "tensor": 1.5, "op": 2.0}


@dataclass(frozen=True)
class Child:
    """One finished child process: wall and CPU seconds, peak RSS, exit code."""

    wall: float
    cpu: float
    max_rss_mb: float
    code: int


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ids_for(size: Size, seq: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, size.vocab, (size.batch, seq or size.seq), generator=gen)


def step(model: torch.nn.Module, ids: torch.Tensor) -> None:
    model(input_ids=ids, labels=ids).loss.backward()


# A child's ru_maxrss starts at its parent's RSS at fork (Linux keeps it across exec), so the
# commands are started by a bare Python launcher, whose own RSS is small, and it reports them.
LAUNCHER = """
import json, os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - start
code = os.waitstatus_to_exitcode(status)
with open(sys.argv[1], "w") as f:
    json.dump({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_kb": usage.ru_maxrss, "code": code}, f)
"""


def run_child(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Child:
    """Run a command; wall and CPU seconds and peak RSS of that command alone."""
    facts = log.with_suffix(".json")
    with open(log, "w") as out:
        subprocess.run(
            [sys.executable, "-c", LAUNCHER, str(facts), *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        )
    data = json.loads(facts.read_text())
    return Child(data["wall"], data["cpu"], data["rss_kb"] / 1024, data["code"])


# -- 1. recorder overhead ---------------------------------------------------------------------


def time_recorder(model: torch.nn.Module, ids: torch.Tensor, variant: str) -> float:
    model.zero_grad(set_to_none=True)
    gc.collect()
    spec = RECORDER_VARIANTS[variant]
    start = time.perf_counter()
    if spec is None:
        step(model, ids)
    else:
        with Recorder(model, mode=spec[0], level=spec[1]):
            step(model, ids)
    return time.perf_counter() - start


def recorder_overhead(
    model: torch.nn.Module, ids: torch.Tensor, warmup: int, rounds: int
) -> dict[str, float]:
    times: dict[str, list[float]] = {v: [] for v in RECORDER_VARIANTS}
    for rnd in range(warmup + rounds):
        line = {v: time_recorder(model, ids, v) for v in RECORDER_VARIANTS}
        if rnd >= warmup:
            for v, t in line.items():
                times[v].append(t)
        label = f"round {rnd - warmup + 1}" if rnd >= warmup else "warm-up"
        print(f"  {label:<9} " + "  ".join(f"{v}={t:.3f}s" for v, t in line.items()), flush=True)
    return {v: median(ts) for v, ts in times.items()}


def msprobe_worker(args: argparse.Namespace) -> int:
    """Child process: one msprobe config, interleaved with plain steps; prints JSON medians."""
    from msprobe.pytorch import PrecisionDebugger

    task, level = args.msprobe_worker
    size = _size(args)
    model = build_qwen2(size, "sdpa")
    ids = ids_for(size)
    work = Path(args.workdir) / f"msprobe_{task}_{level}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = {
        "task": task,
        "dump_path": str(work / "dump"),
        "rank": [],
        "step": [],
        "level": level,
        "async_dump": False,
        task: {
            "scope": [],
            "list": [],
            "data_mode": ["all"],
            **({"summary_mode": "statistics"} if task == "statistics" else {}),
        },
    }
    (work / "config.json").write_text(json.dumps(config))
    debugger = PrecisionDebugger(config_path=str(work / "config.json"))
    plain: list[float] = []
    probed: list[float] = []
    for rnd in range(args.warmup + args.rounds):
        model.zero_grad(set_to_none=True)
        gc.collect()
        start = time.perf_counter()
        step(model, ids)
        t_plain = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        gc.collect()
        start = time.perf_counter()
        debugger.start(model=model)
        step(model, ids)
        debugger.stop()
        t_probe = time.perf_counter() - start
        debugger.step()
        shutil.rmtree(work / "dump", ignore_errors=True)  # each step's dump: keep the disk free
        if rnd >= args.warmup:
            plain.append(t_plain)
            probed.append(t_probe)
        print(
            f"  msprobe {task} {level}: plain={t_plain:.3f}s msprobe={t_probe:.3f}s",
            file=sys.stderr,
            flush=True,
        )
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"plain": median(plain), "msprobe": median(probed)}))
    return 0


def msprobe_overhead(args: argparse.Namespace, name: str) -> dict[str, float]:
    task, level = MSPROBE_CONFIGS[name]
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--msprobe-worker",
        task,
        level,
        "--workdir",
        args.workdir,
    ]
    cmd += ["--rounds", str(args.rounds), "--warmup", str(args.warmup)] + (["--quick"] if args.quick else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stderr.splitlines() if line.startswith("  msprobe ")]
    print("\n".join(lines), flush=True)
    if done.returncode != 0:
        raise SystemExit(f"msprobe worker {task} {level} failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- 2. tensor mode to disk ---------------------------------------------------------------------


def record_tensor(model: torch.nn.Module, ids: torch.Tensor) -> Trace:
    model.zero_grad(set_to_none=True)
    with Recorder(model, mode="tensor") as rec:
        step(model, ids)
    model.zero_grad(set_to_none=True)
    return rec.trace()


def fsync_tree(folder: Path) -> None:
    for file in folder.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def dd_gbps(folder: Path, nbytes: int, sync: bool) -> float:
    target = folder / "dd.bin"
    count = max(1, nbytes // 2**20)
    cmd = ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}"] + (
        ["conv=fdatasync"] if sync else []
    )
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    target.unlink()
    return count * 2**20 / seconds / 1e9


def disk_write(trace: Trace, workdir: Path, rounds: int) -> dict[str, float]:
    nbytes = sum(t.numel() * t.element_size() for t in trace.tensors.values())
    cached: list[float] = []
    synced: list[float] = []
    dd_cached: list[float] = []
    dd_synced: list[float] = []
    for rnd in range(rounds):
        out = workdir / f"trace{rnd}"
        start = time.perf_counter()
        write_trace(trace, out)
        mid = time.perf_counter()
        fsync_tree(out)
        end = time.perf_counter()
        cached.append(nbytes / (mid - start) / 1e9)
        synced.append(nbytes / (end - start) / 1e9)
        shutil.rmtree(out)
        dd_cached.append(dd_gbps(workdir, nbytes, sync=False))
        dd_synced.append(dd_gbps(workdir, nbytes, sync=True))
        print(
            f"  round {rnd + 1}: write_trace {cached[-1]:.2f} GB/s (+fsync {synced[-1]:.2f}), "
            f"dd {dd_cached[-1]:.2f} GB/s (fdatasync {dd_synced[-1]:.2f})",
            flush=True,
        )
    return {
        "bytes": nbytes,
        "write_gbps": median(cached),
        "write_fsync_gbps": median(synced),
        "dd_gbps": median(dd_cached),
        "dd_fdatasync_gbps": median(dd_synced),
    }


# -- 3. offline compare ---------------------------------------------------------------------------


def perturb(model: torch.nn.Module, layer: int) -> None:
    param = dict(model.named_parameters())[f"model.layers.{layer}.mlp.down_proj.weight"]
    with torch.no_grad():
        param.add_(1e-3 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))


def build_pair(size: Size, seq: int, folder: Path) -> dict[str, Any]:
    """golden/ and target/ msprobe tensor dumps of one step at this seq length."""
    shutil.rmtree(folder, ignore_errors=True)
    ids = ids_for(size, seq)
    model = build_qwen2(size, "sdpa")
    golden = record_tensor(model, ids)
    write_msprobe_dump(golden, folder / "golden")
    perturb(model, size.layers // 2)
    target = record_tensor(model, ids)
    write_msprobe_dump(target, folder / "target")
    float_bytes = [t.numel() * t.element_size() for t in golden.tensors.values() if t.is_floating_point()]
    largest = max(t.numel() * t.element_size() for t in golden.tensors.values())
    del golden, target, model
    gc.collect()
    return {"seq": seq, "fp32_bytes_both": 2 * sum(float_bytes), "largest_pair_bytes": 2 * largest}


def compare_pair(folder: Path, rounds: int, env: dict[str, str]) -> dict[str, Any]:
    golden, target = folder / "golden" / "step0", folder / "target" / "step0"
    precalign, msprobe = find_command("precalign"), find_command("msprobe")
    runs: dict[str, list[Child]] = {"precalign": [], "msprobe": []}
    inproc: list[float] = []
    for rnd in range(rounds + 1):  # one discarded warm-up round (page cache)
        out = folder / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        ours = run_child(
            [precalign, "compare", str(golden / "rank0"), str(target / "rank0"), "--report", str(out / "p")],
            out / "precalign.log",
            env,
        )
        theirs = run_child(
            [msprobe, "compare", "-tp", str(target), "-gp", str(golden), "-o", str(out / "m")],
            out / "msprobe.log",
            env,
        )
        if ours.code not in (0, 1) or theirs.code != 0:
            raise SystemExit(f"compare failed (precalign {ours.code}, msprobe {theirs.code}); logs in {out}")
        gc.collect()
        start = time.perf_counter()
        compare_runs(golden / "rank0", target / "rank0")  # in this process: just the compare
        in_s = time.perf_counter() - start
        if rnd:
            runs["precalign"].append(ours)
            runs["msprobe"].append(theirs)
            inproc.append(in_s)
        print(
            f"  {'round ' + str(rnd) if rnd else 'warm-up':<9} precalign {ours.wall:.2f}s ({ours.max_rss_mb:.0f} MB) "
            f"msprobe {theirs.wall:.2f}s ({theirs.max_rss_mb:.0f} MB) in-process {in_s:.2f}s",
            flush=True,
        )
    found = json.loads((folder / "out" / "p" / "report.json").read_text())
    return {
        "precalign_s": median([c.wall for c in runs["precalign"]]),
        "precalign_cpu_s": median([c.cpu for c in runs["precalign"]]),
        "precalign_rss_mb": max(c.max_rss_mb for c in runs["precalign"]),
        "msprobe_s": median([c.wall for c in runs["msprobe"]]),
        "msprobe_cpu_s": median([c.cpu for c in runs["msprobe"]]),
        "msprobe_rss_mb": max(c.max_rss_mb for c in runs["msprobe"]),
        "inproc_s": median(inproc),
        "first_divergence": _first(found),
    }


def _first(report: Any) -> str | None:
    for item in report.get("cases", []):
        first = item.get("first_divergence")
        if first and item.get("phase") == "forward":
            return str(first.get("name"))
    return None


# -- 4. pytest --co with the plugin installed but unused ------------------------------------------


def collect_only(workdir: Path, rounds: int, env: dict[str, str]) -> dict[str, float]:
    folder = workdir / "collect"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "pytest.ini").write_text("[pytest]\n")  # roots pytest here, away from the repo's config
    (folder / "test_dummy.py").write_text(
        "".join(f"def test_{i}():\n    assert {i} == {i}\n\n" for i in range(20))
    )
    base = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", str(folder)]
    check = subprocess.run(
        [*base, "--trace-config"], capture_output=True, text=True, env=env, cwd=folder, check=False
    )
    if "pytest_precalign" not in check.stdout:
        raise SystemExit("the precalign plugin is not registered (pip install -e .)")
    times: dict[str, list[float]] = {"with": [], "without": []}
    for rnd in range(rounds + 1):
        for label, extra in (("with", []), ("without", ["-p", "no:precalign"])):
            start = time.perf_counter()
            subprocess.run([*base, *extra], capture_output=True, env=env, cwd=folder, check=True)
            if rnd:
                times[label].append(time.perf_counter() - start)
    shutil.rmtree(folder)
    with_s, without_s = median(times["with"]), median(times["without"])
    print(
        f"  pytest --co: {with_s * 1000:.0f} ms with the plugin, {without_s * 1000:.0f} ms with -p no:precalign",
        flush=True,
    )
    return {
        "with_ms": with_s * 1000,
        "without_ms": without_s * 1000,
        "plugin_import_ms": (with_s - without_s) * 1000,
    }


# -- main -----------------------------------------------------------------------------------------


def _size(args: argparse.Namespace) -> Size:
    size = SIZES["mid"]
    return replace(size, seq=128) if args.quick else size


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="seq 128, fewer rounds, smaller compare dumps")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 5, --quick 3)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir, removed)")
    parser.add_argument("--msprobe-worker", nargs=2, metavar=("TASK", "LEVEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.msprobe_worker:
        return msprobe_worker(args)
    own_workdir = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="precalign-vs-msprobe-"))
    workdir.mkdir(parents=True, exist_ok=True)
    args.workdir = str(workdir)
    size = _size(args)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    load_start = os.getloadavg()[0]
    print(
        f"Qwen2ForCausalLM hidden {size.hidden}, {size.layers} layers, batch {size.batch}, seq {size.seq}, fp32, sdpa, "
        f"CPU threads {torch.get_num_threads()}; load average {load_start:.2f} ({os.cpu_count()} CPUs)",
        flush=True,
    )
    try:
        print("\n1. recorder overhead (interleaved)", flush=True)
        model = build_qwen2(size, "sdpa")
        ids = ids_for(size)
        ours = recorder_overhead(model, ids, args.warmup, args.rounds)
        theirs = {}
        for name in MSPROBE_CONFIGS:
            theirs[name] = msprobe_overhead(args, name)

        print("\n2. tensor mode to disk", flush=True)
        disk = disk_write(record_tensor(model, ids), workdir, min(args.rounds, 2 if args.quick else 3))
        del model
        gc.collect()

        print("\n3. offline compare of two msprobe tensor dumps", flush=True)
        probe = bandwidth_probe(rounds=3)
        compares = []
        for seq in (32, 16) if args.quick else (256, 64):
            pair = build_pair(size, seq, workdir / f"pair{seq}")
            print(f" seq {seq}: {pair['fp32_bytes_both'] / 1e9:.2f} GB of fp32 in both dumps", flush=True)
            pair.update(compare_pair(workdir / f"pair{seq}", min(args.rounds, 2 if args.quick else 3), env))
            shutil.rmtree(workdir / f"pair{seq}")
            compares.append(pair)
        probe = {k: max(v, bandwidth_probe(rounds=3)[k]) for k, v in probe.items()}  # best of before/after
        print(
            f" bandwidth probe (numpy max |a - b|, 2 x 512 MiB fp32): {probe['probe_gbps']:.2f} GB/s",
            flush=True,
        )

        print("\n4. pytest --co, plugin installed but unused", flush=True)
        collect = collect_only(workdir, 5 if args.quick else 11, env)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    load_end = os.getloadavg()[0]
    compares[0]["probe"] = probe
    return report(args, size, ours, theirs, disk, compares, collect, load_start, load_end)


def report(
    args: argparse.Namespace,
    size: Size,
    ours: dict[str, float],
    theirs: dict[str, dict[str, float]],
    disk: dict[str, float],
    compares: list[dict[str, Any]],
    collect: dict[str, float],
    load_start: float,
    load_end: float,
) -> int:
    base = ours["none"]
    ratios = {v: ours[v] / base for v in RECORDER_VARIANTS}
    ms_ratios = {n: r["msprobe"] / r["plain"] for n, r in theirs.items()}
    big = compares[0]
    speedup = big["msprobe_s"] / big["precalign_s"]
    gbps_core = big["fp32_bytes_both"] / big["precalign_cpu_s"] / 1e9
    gbps_wall = big["fp32_bytes_both"] / big["precalign_s"] / 1e9
    gbps_inproc = big["fp32_bytes_both"] / big["inproc_s"] / 1e9
    fraction = gbps_inproc / big["probe"]["probe_gbps"]

    def goal(v: str) -> str:
        return f"<= {GOALS[v]:.2f}x {'met' if ratios[v] <= GOALS[v] else 'NOT met'}" if v in GOALS else ""

    rows = [
        "| measurement | pytest-precalign | msprobe 26.2.0 | goal |",
        "|---|---|---|---|",
        f"| fwd+bwd, no recorder | {base:.3f} s (1.00x) | {median([r['plain'] for r in theirs.values()]):.3f} s in its children | |",
        f"| stats, modules (msprobe: statistics L0) | {ratios['stats']:.2f}x | {ms_ratios['msprobe_stats']:.2f}x | {goal('stats')} |",
        f"| tensor in memory (msprobe: tensor L0, to disk) | {ratios['tensor']:.2f}x | {ms_ratios['msprobe_tensor']:.2f}x | {goal('tensor')} |",
        f"| op level, stats | {ratios['op']:.2f}x | | {goal('op')} |",
        f"| mix level, stats (msprobe: statistics mix) | {ratios['mix']:.2f}x | {ms_ratios['msprobe_mix']:.2f}x | |",
        f"| tensor trace to disk ({disk['bytes'] / 1e9:.2f} GB) | {disk['write_gbps']:.2f} GB/s, {disk['write_fsync_gbps']:.2f} GB/s with fsync "
        f"| dd: {disk['dd_gbps']:.2f} GB/s, {disk['dd_fdatasync_gbps']:.2f} GB/s with fdatasync | |",
    ]
    for c in compares:
        rows.append(
            f"| compare, seq {c['seq']} ({c['fp32_bytes_both'] / 1e9:.2f} GB fp32 both sides) | {c['precalign_s']:.2f} s, "
            f"{c['precalign_cpu_s']:.2f} CPU s | {c['msprobe_s']:.2f} s, {c['msprobe_cpu_s']:.2f} CPU s | |"
        )
    rows.append(
        f"| compare speedup / throughput (seq {big['seq']}) | {speedup:.1f}x, {gbps_core:.2f} GB/s per core ({gbps_wall:.2f} GB/s wall) | 1.0x | |"
    )
    rows.append(
        f"| in-process compare (seq {big['seq']}) / bandwidth probe | {gbps_inproc:.2f} GB/s / "
        f"{big['probe']['probe_gbps']:.2f} GB/s = {fraction:.2f} | | >= 0.50 {'met' if fraction >= 0.5 else 'NOT met'}, "
        f"CLI >= 20x {'met' if speedup >= 20 else 'NOT met'} |"
    )
    for c in compares:
        rows.append(
            f"| compare peak RSS, seq {c['seq']} (largest tensor pair {c['largest_pair_bytes'] / 2**20:.0f} MiB) | "
            f"{c['precalign_rss_mb']:.0f} MB | {c['msprobe_rss_mb']:.0f} MB | |"
        )
    rows.append(
        f"| `pytest --co`, plugin unused | {collect['plugin_import_ms']:+.0f} ms ({collect['with_ms']:.0f} vs "
        f"{collect['without_ms']:.0f} ms) | | <= 50 ms {'met' if collect['plugin_import_ms'] <= 50 else 'NOT met'} |"
    )
    print("\n" + "\n".join(rows))
    print(f"\nfirst divergence found by precalign compare: {big['first_divergence']}")
    print(f"1-min load average: {load_start:.2f} at start, {load_end:.2f} at end ({os.cpu_count()} CPUs)")
    payload = {
        "stats_ratio": round(ratios["stats"], 3),
        "tensor_ratio": round(ratios["tensor"], 3),
        "op_ratio": round(ratios["op"], 3),
        "mix_ratio": round(ratios["mix"], 3),
        "msprobe_stats_ratio": round(ms_ratios["msprobe_stats"], 3),
        "msprobe_tensor_ratio": round(ms_ratios["msprobe_tensor"], 3),
        "msprobe_mix_ratio": round(ms_ratios["msprobe_mix"], 3),
        "baseline_s": round(base, 4),
        "write_gbps": round(disk["write_gbps"], 3),
        "write_fsync_gbps": round(disk["write_fsync_gbps"], 3),
        "dd_gbps": round(disk["dd_gbps"], 3),
        "dd_fdatasync_gbps": round(disk["dd_fdatasync_gbps"], 3),
        "compare_speedup_vs_msprobe": round(speedup, 2),
        "compare_gbps": round(gbps_core, 3),
        "compare_gbps_wall": round(gbps_wall, 3),
        "compare_inproc_gbps": round(gbps_inproc, 3),
        **big["probe"],
        "compare_bandwidth_fraction": round(fraction, 3),
        "compare_peak_rss_mb": {str(c["seq"]): round(c["precalign_rss_mb"]) for c in compares},
        "msprobe_compare_peak_rss_mb": {str(c["seq"]): round(c["msprobe_rss_mb"]) for c in compares},
        "largest_pair_mib": {str(c["seq"]): round(c["largest_pair_bytes"] / 2**20) for c in compares},
        "compare_fp32_gb": {str(c["seq"]): round(c["fp32_bytes_both"] / 1e9, 3) for c in compares},
        "plugin_import_ms": round(collect["plugin_import_ms"], 1),
        "seq": size.seq,
        "quick": args.quick,
        "rounds": args.rounds,
        **run_facts(load_start, load_end),
    }
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
