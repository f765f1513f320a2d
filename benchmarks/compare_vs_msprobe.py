"""Offline compare speed: ``msprobe compare`` against ``precalign compare`` on the same dumps.

What it measures
    Two msprobe tensor dumps (L0, ``dump_tensor_data/*.pt``, fp32) of one forward+backward
    of a randomly initialised ``transformers.Qwen2ForCausalLM`` (``torch.manual_seed(0)``,
    nothing downloaded, ``labels=input_ids``), recorded with
    ``Recorder(model, mode="tensor")`` and written with ``write_msprobe_dump``:

    * golden -- the original weights;
    * target -- the same model with ``model.layers.<L>.mlp.down_proj.weight`` perturbed by
      ``1e-3 * randn`` (``--layer``, default the middle layer; seed 1).

    The sequence length is chosen (by a linear fit over two short recordings) so that one
    side holds about ``--target-gb`` GB (1e9 bytes) of tensors. The dumps are built in
    ``--workdir`` and reused by later runs while their settings match (``meta.json``).

    Then, interleaved round-robin over ``--rounds`` rounds (after one discarded warm-up
    round), three variants:

    * ``msprobe``        -- ``msprobe compare -tp <target>/step0 -gp <golden>/step0 -o <out>``
      as a subprocess (wall time, Python start-up included);
    * ``precalign_cli``  -- ``precalign compare <golden>/step0/rank0 <target>/step0/rank0
      --report <out>`` as a subprocess (wall time, Python start-up and imports included; the
      package's bytecode is compiled first, as ``pip install`` leaves an installed package;
      its compare workers are the default: the cores free at that moment, forked processes);
    * ``precalign_inproc`` -- ``pytest_precalign.run.offline.compare_runs(golden, target)`` in this
      process (just the compare: reading dump.json, loading the .pt files, mapping,
      comparing, verdicts).

    CPU seconds (user+sys, children included for the subprocesses) are recorded beside the
    wall times. Page cache: before the rounds every file of both dumps is read once, and
    ``fincore`` reports how much of them is resident before and after; the timings are warm-
    cache timings unless ``--cold`` is given, which evicts the dump files with
    ``posix_fadvise(DONTNEED)`` before every timed run (no root needed; dirty pages stay).

Figures
    ``speedup_cli = msprobe_s / precalign_cli_s`` and ``speedup_inproc = msprobe_s /
    precalign_inproc_s`` (medians). ``compare_gbps`` = the fp32 bytes of both sides (numel
    x 4 from dump.json, summed over golden and target) / the in-process median;
    ``compare_gbps_per_core`` = the same bytes / the in-process median CPU seconds (bytes per
    busy-core second). ``compare_bandwidth_fraction`` = ``compare_gbps`` / ``probe_gbps``, the
    machine's own bandwidth measured in the same run (``bandwidth_probe.py``: numpy max |a - b|
    of two 512 MiB fp32 arrays, the better of a measurement before and one after the rounds);
    ``compare_speedup_vs_msprobe`` = ``speedup_cli``. Goals: >= 0.5 and >= 20. Both tools must find the perturbed layer: msprobe's first CSV row whose
    ``Result`` is not ``pass`` and precalign's forward ``first_divergence`` are printed and
    checked against ``layers.<L>.mlp``.

Output
    A table of medians and mins, then, as the last line of stdout, one JSON object
    (``dump_gb_per_side``, ``msprobe_s``, ``precalign_cli_s``, ``precalign_inproc_s``,
    ``speedup_cli``, ``speedup_inproc``, ``compare_gbps``, ``compare_gbps_per_core``,
    ``probe_gbps``, ``compare_bandwidth_fraction``, ``compare_speedup_vs_msprobe``,
    ``found_by_precalign``, ``found_by_msprobe``, ...).

Reproduce (from the repository root; a few minutes the first time, which builds the dumps,
about 1 minute when --workdir already holds them; needs ~2.5 GB free there)::

    . .venv/bin/activate
    python benchmarks/compare_vs_msprobe.py --rounds 3 --target-gb 1.0 \
        --workdir /tmp/precalign-compare-bench --keep
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from _commands import find_command
from _shared import SIZES, Size, build_qwen2, run_facts
from bandwidth_probe import bandwidth_probe

from pytest_precalign.msprobe.writer import build_dump, write_msprobe_dump
from pytest_precalign.recording import HookRecorder as Recorder
from pytest_precalign.run.offline import compare_runs
from pytest_precalign.trace.records import Trace

VARIANTS: tuple[str, ...] = ("msprobe", "precalign_cli", "precalign_inproc")
FIT_SEQS: tuple[int, int] = (16, 48)  # short recordings for the bytes-vs-seq fit
SEQ_MULTIPLE = 8
PERTURB_SCALE = 1e-3


@dataclass
class Timing:
    wall: float
    cpu: float


@dataclass
class Finding:
    name: str
    detail: str


# -- the dumps -------------------------------------------------------------------------------


def record(model: torch.nn.Module, size: Size, seq: int) -> Trace:
    ids = torch.randint(0, size.vocab, (size.batch, seq), generator=torch.Generator().manual_seed(0))
    model.zero_grad(set_to_none=True)
    with Recorder(model, mode="tensor") as rec:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    trace = rec.trace()
    model.zero_grad(set_to_none=True)
    return trace


def dump_bytes(trace: Trace) -> int:
    """The tensor bytes ``write_msprobe_dump`` writes (one .pt per msprobe data_name)."""
    _, _, files = build_dump(trace)
    total = 0
    for rec in files.values():
        tensor = trace.tensor(rec)
        total += tensor.numel() * tensor.element_size()
    return total


def choose_seq(model: torch.nn.Module, size: Size, target_bytes: float) -> int:
    """bytes(seq) is linear in seq (sdpa keeps no seq x seq tensor): fit it on two short runs."""
    (s0, s1) = FIT_SEQS
    b0 = dump_bytes(record(model, size, s0))
    b1 = dump_bytes(record(model, size, s1))
    per_token = (b1 - b0) / (s1 - s0)
    fixed = b0 - per_token * s0
    seq = (target_bytes - fixed) / per_token
    return max(SEQ_MULTIPLE, int(round(seq / SEQ_MULTIPLE)) * SEQ_MULTIPLE)


def perturb(model: torch.nn.Module, layer: int) -> str:
    name = f"model.layers.{layer}.mlp.down_proj.weight"
    param = dict(model.named_parameters())[name]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        param.add_(PERTURB_SCALE * torch.randn(param.shape, generator=gen, dtype=param.dtype))
    return name


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in files_of(folder))


def fp32_bytes(rank_dir: Path) -> int:
    """numel x element size of every tensor dump.json names (what a compare has to read)."""
    sizes = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}
    data = json.loads((rank_dir / "dump.json").read_text(encoding="utf-8"))["data"]

    def walk(value: Any) -> Iterator[int]:
        if isinstance(value, list):
            for item in value:
                yield from walk(item)
        elif isinstance(value, dict) and "data_name" in value and "shape" in value:
            n = 1
            for d in value["shape"]:
                n *= int(d)
            yield n * sizes.get(str(value.get("dtype", "")).removeprefix("torch."), 4)
        elif isinstance(value, dict):
            for item in value.values():
                yield from walk(item)

    return sum(walk(data))


def build_dumps(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """golden/ and target/ msprobe dumps under workdir, reused while meta.json matches."""
    size = SIZES[args.size]
    layer = args.layer if args.layer is not None else size.layers // 2
    want = {
        "size": asdict(size),
        "target_gb": args.target_gb,
        "layer": layer,
        "perturb_scale": PERTURB_SCALE,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    meta_file = workdir / "meta.json"
    golden, target = workdir / "golden", workdir / "target"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        ready = all((side / "step0" / "rank0" / "dump.json").is_file() for side in (golden, target))
        if meta.get("settings") == want and ready:
            print(f"reusing the dumps in {workdir} (seq {meta['seq']}, built in {meta['build_s']:.0f} s)")
            return dict(meta)
    for stale in (golden, target, meta_file):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    start = time.perf_counter()
    model = build_qwen2(size, "sdpa")
    seq = choose_seq(model, size, args.target_gb * 1e9)
    print(
        f"building the dumps: {args.size} Qwen2, batch {size.batch}, seq {seq} (fitted to {args.target_gb} GB)"
    )
    trace = record(model, size, seq)
    write_msprobe_dump(trace, golden)
    del trace
    gc.collect()
    param = perturb(model, layer)
    trace = record(model, size, seq)
    write_msprobe_dump(trace, target)
    del trace, model
    gc.collect()
    meta = {
        "settings": want,
        "seq": seq,
        "batch": size.batch,
        "perturbed": param,
        "layer": layer,
        "build_s": time.perf_counter() - start,
    }
    meta_file.write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


# -- page cache ------------------------------------------------------------------------------


def resident_bytes(paths: Sequence[Path]) -> int | None:
    """Bytes of ``paths`` in the page cache, from util-linux ``fincore`` (None without it)."""
    exe = shutil.which("fincore")
    if exe is None:
        return None
    total = 0
    for i in range(0, len(paths), 200):
        chunk = [str(p) for p in paths[i : i + 200]]
        out = subprocess.run(
            [exe, "--bytes", "--noheadings", "--raw", "--output", "RES", *chunk],
            capture_output=True,
            text=True,
            check=False,
        )
        total += sum(int(line.split()[0]) for line in out.stdout.splitlines() if line.strip())
    return total


def read_all(paths: Sequence[Path]) -> tuple[int, float]:
    start = time.perf_counter()
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(1 << 22):
                total += len(chunk)
    return total, time.perf_counter() - start


def evict(paths: Sequence[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- the variants ----------------------------------------------------------------------------


def compile_package() -> str:
    """Write pytest_precalign's bytecode, as ``pip install`` does for an installed package (and
    has done for msprobe's): an editable install under ``PYTHONDONTWRITEBYTECODE=1`` (set on
    this machine) would otherwise compile its modules at every CLI start (~0.09 s)."""
    import pytest_precalign

    package = Path(pytest_precalign.__file__).parent
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(package)], check=True, stdout=subprocess.DEVNULL
    )
    flag = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
    return f"bytecode: compiled {package} (as an installed package has it; PYTHONDONTWRITEBYTECODE={flag!r})"


def cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_subprocess(cmd: Sequence[str], ok_codes: tuple[int, ...], log: Path) -> Timing:
    cpu0 = cpu_children()
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall = time.perf_counter() - start
    if proc.returncode not in ok_codes:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}; see {log}")
    return Timing(wall, cpu_children() - cpu0)


_MSPROBE_FWD_OUT = re.compile(r"^Module\.(?P<path>.+)\.[^.]+\.forward\.\d+\.output\b")


def innermost(failing: Sequence[str]) -> str | None:
    """The first failing module (in order) with no failing module inside it: with L0 (module)
    dumps every enclosing module fails too, and the one that brings the divergence in is the
    innermost one."""
    for name in failing:
        if not any(other.startswith(name + ".") for other in failing):
            return name
    return None


def msprobe_findings(out: Path) -> tuple[Finding | None, str | None]:
    """msprobe's CSV: its first row whose Result is not pass, and the innermost failing
    forward module."""
    csvs = sorted(out.rglob("*.csv"))
    if not csvs:
        return None, None
    first: Finding | None = None
    failing: list[str] = []
    with open(csvs[0], newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            result = (row.get("Result") or "").strip()
            if not result or result.lower() == "pass":
                continue
            name = row.get("NPU Name") or next(iter(row.values()))
            if first is None:
                first = Finding(name, f"Result {result}, Cosine {row.get('Cosine', '?')}")
            m = _MSPROBE_FWD_OUT.match(name)
            if m and m.group("path") not in failing:
                failing.append(m.group("path"))
    return first, innermost(failing)


def precalign_findings(report_dir: Path) -> tuple[Finding | None, str | None]:
    """report.json's forward first_divergence, and the innermost failing forward module."""
    data = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    for case in data["cases"]:
        if case.get("phase") != "forward":
            continue
        first = case.get("first_divergence")
        finding = None
        if first:
            finding = Finding(
                f"{first['name']} ({first['kind']} {first['slot']})",
                f"{first['metric']} {first['value']:.3g} > {first['allowed']:.3g}",
            )
        failing = [f["name"] for f in case.get("failures", []) if f.get("kind") == "activation"]
        return finding, innermost(list(dict.fromkeys(failing)))
    return None, None


def name_of(finding: Finding | None) -> str | None:
    return finding.name if finding is not None else None


def main_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--target-gb", type=float, default=1.0, help="tensor GB per side (default 1.0)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the dumps are built and cached (default: a new temporary directory)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (dumps, last outputs) at the end"
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--layer", type=int, default=None, help="layer whose down_proj is perturbed")
    parser.add_argument("--cold", action="store_true", help="evict the dump files before every timed run")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.target_gb <= 0:
        parser.error("--rounds must be >= 1 and --target-gb > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = main_args(argv)
    msprobe_exe, precalign_exe = find_command("msprobe"), find_command("precalign")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="precalign-compare-bench."))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, workdir, msprobe_exe, precalign_exe)
    finally:
        if args.keep:
            print(f"kept {workdir} (pass --workdir {workdir} to reuse the dumps)", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, workdir: Path, msprobe_exe: str, precalign_exe: str) -> int:
    print(
        f"torch={torch.__version__} transformers={transformers.__version__} "
        f"python={platform.python_version()} cpus={os.cpu_count()} torch threads={torch.get_num_threads()}"
    )
    meta = build_dumps(args, workdir)
    golden_rank = workdir / "golden" / "step0" / "rank0"
    target_rank = workdir / "target" / "step0" / "rank0"
    paths = files_of(golden_rank) + files_of(target_rank)
    disk = {side: disk_bytes(workdir / side / "step0" / "rank0") for side in ("golden", "target")}
    tensor_bytes = fp32_bytes(golden_rank) + fp32_bytes(target_rank)
    n_pt = sum(1 for p in paths if p.suffix == ".pt")
    print(
        f"dumps: golden {disk['golden'] / 1e9:.3f} GB, target {disk['target'] / 1e9:.3f} GB on disk; "
        f"{n_pt} .pt files; {tensor_bytes / 1e9:.3f} GB of tensors in both; perturbed {meta['perturbed']}"
    )
    total_disk = disk["golden"] + disk["target"]
    before = resident_bytes(paths)
    read, read_s = read_all(paths)
    after = resident_bytes(paths)

    def pct(value: int | None) -> str:
        # fincore counts whole pages, so a fully cached file shows a little over 100%.
        return "unknown (no fincore)" if value is None else f"{min(value / total_disk, 1.0):.0%}"

    print(
        f"page cache: {pct(before)} of the dump files resident before the warm-up read "
        f"({read / 1e9:.2f} GB in {read_s:.2f} s = {read / 1e9 / read_s:.2f} GB/s), {pct(after)} after"
    )
    print("timings are " + ("COLD (files evicted before every run)" if args.cold else "warm-cache"))
    print(compile_package())
    probe = bandwidth_probe(rounds=3)
    print(f"bandwidth probe (numpy max |a - b|, 2 x 512 MiB fp32): {probe['probe_gbps']:.2f} GB/s of input")

    out = workdir / "out"
    found: dict[str, tuple[Finding | None, str | None]] = {}

    def msprobe_run(tag: str) -> Timing:
        dest = out / f"msprobe_{tag}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        timing = run_subprocess(
            [msprobe_exe, "compare", "-tp", str(target_rank.parent), "-gp", str(golden_rank.parent)]
            + ["-o", str(dest)],
            (0,),
            dest / "log.txt",
        )
        found["msprobe"] = msprobe_findings(dest)
        return timing

    def cli_run(tag: str) -> Timing:
        dest = out / f"precalign_{tag}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        timing = run_subprocess(
            [precalign_exe, "compare", str(golden_rank), str(target_rank), "--report", str(dest)],
            (0, 1),
            dest / "log.txt",
        )
        found["precalign"] = precalign_findings(dest)
        return timing

    def inproc_run(tag: str) -> Timing:
        gc.collect()
        cpu0 = cpu_self()
        start = time.perf_counter()
        run_ = compare_runs(golden_rank, target_rank)
        wall = time.perf_counter() - start
        cpu = cpu_self() - cpu0
        verdict = run_.verdicts["forward"]
        first = verdict.first
        failing = [p.record.name for p in verdict.failures if p.record.kind == "activation"]
        found["inproc"] = (
            Finding(f"{first.name} ({first.kind} {first.slot})", "") if first else None,
            innermost(list(dict.fromkeys(failing))),
        )
        del run_
        return Timing(wall, cpu)

    runners: dict[str, Callable[[str], Timing]] = {
        "msprobe": msprobe_run,
        "precalign_cli": cli_run,
        "precalign_inproc": inproc_run,
    }
    load_start = os.getloadavg()[0]
    results: dict[str, list[Timing]] = {v: [] for v in VARIANTS}
    print(f"interleaved: 1 warm-up + {args.rounds} measured rounds over {', '.join(VARIANTS)}")
    for rnd in range(1 + args.rounds):
        line = []
        for variant in VARIANTS:
            if args.cold:
                evict(paths)
            timing = runners[variant](str(rnd))
            line.append(f"{variant}={timing.wall:.2f}s (cpu {timing.cpu:.2f}s)")
            if rnd >= 1:
                results[variant].append(timing)
        label = f"round {rnd}" if rnd else "warm-up"
        print(f"  {label:<8} " + "  ".join(line), flush=True)
    after_probe = bandwidth_probe(rounds=3)  # the machine's best of before and after the rounds
    probe = {k: max(v, after_probe[k]) for k, v in probe.items()}
    load_end = os.getloadavg()[0]

    med: dict[str, float] = {}
    cpu_med: dict[str, float] = {}
    print(f"\n{'variant':<17} {'median s':>9} {'min s':>9} {'cpu s':>7}")
    for variant in VARIANTS:
        walls = [t.wall for t in results[variant]]
        med[variant] = statistics.median(walls)
        cpu_med[variant] = statistics.median(t.cpu for t in results[variant])
        print(f"{variant:<17} {med[variant]:>9.3f} {min(walls):>9.3f} {cpu_med[variant]:>7.2f}")
    speedup_cli = med["msprobe"] / med["precalign_cli"]
    speedup_inproc = med["msprobe"] / med["precalign_inproc"]
    gbps = tensor_bytes / 1e9 / med["precalign_inproc"]
    gbps_core = tensor_bytes / 1e9 / cpu_med["precalign_inproc"]
    print(f"speedup msprobe/precalign: CLI {speedup_cli:.2f}x, in-process {speedup_inproc:.2f}x")
    print(
        f"precalign in-process throughput: {gbps:.3f} GB/s of tensors (both sides), "
        f"{gbps_core:.3f} GB/s per busy core ({cpu_med['precalign_inproc']:.2f} cpu s)"
    )

    fraction = gbps / probe["probe_gbps"]
    print(
        f"in-process compare / bandwidth probe ({probe['probe_gbps']:.2f} GB/s): {fraction:.2f} (goal >= 0.5 "
        f"{'met' if fraction >= 0.5 else 'NOT met'}); CLI speedup {speedup_cli:.1f}x (goal >= 20 "
        f"{'met' if speedup_cli >= 20 else 'NOT met'})"
    )
    module = str(meta["perturbed"]).removesuffix(".weight")
    hits: dict[str, bool] = {}
    print(f"perturbed: {module}")
    for tool, what in (
        ("msprobe", "first non-pass CSV row"),
        ("precalign", "first_divergence (report.json)"),
        ("inproc", "first_divergence (compare_runs)"),
    ):
        first, inner = found.get(tool, (None, None))
        hits[tool] = inner == module
        text = "none" if first is None else first.name + (f" [{first.detail}]" if first.detail else "")
        print(f"  {tool:<9} {what}: {text}")
        print(
            f"  {tool:<9} innermost failing forward module: {inner} -> {'found' if hits[tool] else 'NOT found'}"
        )
    print(
        f"1-min load average: {load_start:.2f} at start, {load_end:.2f} at end "
        f"(machine has {os.cpu_count()} CPUs)"
    )
    payload: dict[str, Any] = {
        "dump_gb_per_side": round(disk["golden"] / 1e9, 4),
        "dump_gb_target": round(disk["target"] / 1e9, 4),
        "tensor_gb_both": round(tensor_bytes / 1e9, 4),
        "pt_files": n_pt,
        "msprobe_s": round(med["msprobe"], 4),
        "precalign_cli_s": round(med["precalign_cli"], 4),
        "precalign_inproc_s": round(med["precalign_inproc"], 4),
        "msprobe_min_s": round(min(t.wall for t in results["msprobe"]), 4),
        "precalign_cli_min_s": round(min(t.wall for t in results["precalign_cli"]), 4),
        "precalign_inproc_min_s": round(min(t.wall for t in results["precalign_inproc"]), 4),
        "msprobe_cpu_s": round(cpu_med["msprobe"], 3),
        "precalign_cli_cpu_s": round(cpu_med["precalign_cli"], 3),
        "precalign_inproc_cpu_s": round(cpu_med["precalign_inproc"], 3),
        "speedup_cli": round(speedup_cli, 3),
        "speedup_inproc": round(speedup_inproc, 3),
        "compare_gbps": round(gbps, 4),
        "compare_gbps_per_core": round(gbps_core, 4),
        **probe,
        "compare_bandwidth_fraction": round(fraction, 3),
        "compare_speedup_vs_msprobe": round(speedup_cli, 2),
        "found_by_precalign": hits["precalign"] and hits["inproc"],
        "found_by_msprobe": hits["msprobe"],
        "perturbed": module,
        "innermost_precalign": found["precalign"][1],
        "innermost_msprobe": found["msprobe"][1],
        "first_divergence_precalign": name_of(found["precalign"][0]),
        "first_row_msprobe": name_of(found["msprobe"][0]),
        "page_cache": "cold" if args.cold else "warm",
        "resident_before_warmup": None if before is None else round(min(before / total_disk, 1.0), 3),
        "resident_after_warmup": None if after is None else round(min(after / total_disk, 1.0), 3),
        "seq": meta["seq"],
        "batch": meta["batch"],
        "size": args.size,
        "rounds": args.rounds,
        **run_facts(load_start, load_end),
    }
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
