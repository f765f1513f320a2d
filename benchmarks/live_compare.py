"""Live compare with a golden run: disk written by full tensor mode vs live mode.

What it measures
    A randomly initialised ``transformers.Qwen2ForCausalLM`` (``_shared.SIZES``, fp32, CPU,
    seed 0, nothing downloaded), one forward+backward with ``labels=input_ids`` recorded with
    ``pytest_precalign.Recorder`` (parameters not recorded: no optimizer step). Runs:

    * golden, stats mode (what live mode compares against) and golden, tensor mode (the full
      tensor baseline);
    * the candidate: the same model with one faulty layer (``--fault``'s output scaled by
      ``--scale`` through a forward hook), recorded in tensor mode (``tensor_bytes``) and live
      against the stats golden (``Recorder(..., golden=...)``, ``live_bytes``).

    Disk bytes are the sizes of all files in each run's folder (tensors, index, manifest).
    ``origin_full``: the origin ``precalign compare`` names from the two tensor traces;
    ``origin_live``: from the stats golden and the live trace; ``origin_live_vs_tensor``: from
    the tensor golden and the live trace.

Goal
    ``live_disk_ratio`` = tensor_bytes / live_bytes >= 10, with the same origin.

Output
    A table, then one JSON line (``live_disk_ratio``, ``tensor_bytes``, ``live_bytes``,
    ``origin_full``, ``origin_live``, ``origin_live_vs_tensor``, ``kept_tensors``, ``beyond``,
    timings and run facts). ``measure_live_disk(size_name)`` returns the same dict (for
    ``recorder_overhead.py``).

Reproduce (from the repository root)::

    . .venv/bin/activate
    python benchmarks/live_compare.py --size mid
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _shared import SIZES, Size, build_qwen2, run_facts  # noqa: E402

from pytest_precalign import Recorder  # noqa: E402
from pytest_precalign.run.offline import compare_runs  # noqa: E402

DEFAULT_FAULT = "model.layers.{mid}.mlp.down_proj"


def make_inputs(size: Size) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, size.vocab, (size.batch, size.seq), generator=gen)


@contextmanager
def faulty(model: torch.nn.Module, name: str, scale: float) -> Iterator[None]:
    handle = model.get_submodule(name).register_forward_hook(lambda m, args, out: out * scale)
    try:
        yield
    finally:
        handle.remove()


def record(model: torch.nn.Module, ids: torch.Tensor, root: Path, **options: Any) -> tuple[Path, float]:
    """One recorded forward+backward into ``root``: (rank folder, seconds incl. writing)."""
    model.zero_grad(set_to_none=True)
    rec = Recorder(root, params=False, **options)
    start = time.perf_counter()
    with rec.recording(model):
        out = model(input_ids=ids, labels=ids)
        rec.record_output("loss", out.loss)
        out.loss.backward()
    return rec.written[-1], time.perf_counter() - start


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def origin(golden: Path, target: Path) -> str:
    """The case origin ``precalign compare golden target`` names: ``module (record)``."""
    run = compare_runs(golden, target)
    for phase in run.phases:
        found = run.verdicts[phase].case_origin
        if found is not None:
            return f"{found.module} ({found.record}, {found.phase})"
    return "none"


def measure_live_disk(
    size_name: str = "mid", fault: str | None = None, scale: float = 1.001, attn: str = "sdpa"
) -> dict[str, Any]:
    """Disk written by tensor mode and live mode for one faulty-layer run (see module doc)."""
    size = SIZES[size_name]
    fault = fault or DEFAULT_FAULT.format(mid=size.layers // 2)
    model = build_qwen2(size, attn)
    ids = make_inputs(size)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="live_compare_") as tmp:
        root = Path(tmp)
        golden, _ = record(model, ids, root / "golden")
        golden_tensor, _ = record(model, ids, root / "golden_tensor", mode="tensor")
        _, stats_s = record(model, ids, root / "stats")
        with faulty(model, fault, scale):
            full, tensor_s = record(model, ids, root / "full", mode="tensor")
            live, live_s = record(model, ids, root / "live", golden=golden)
        summary = json.loads((live / "manifest.json").read_text())["live"]
        tensor_bytes, live_bytes = disk_bytes(full), disk_bytes(live)
        result = {
            "size": size_name,
            "fault": f"{fault} x {scale}",
            "tensor_bytes": tensor_bytes,
            "live_bytes": live_bytes,
            "stats_bytes": disk_bytes(root / "stats"),
            "live_disk_ratio": round(tensor_bytes / live_bytes, 2),
            "origin_full": origin(golden_tensor, full),
            "origin_live": origin(golden, live),
            "origin_live_vs_tensor": origin(golden_tensor, live),
            "records": summary["records"],
            "compared": summary["compared"],
            "beyond": len(summary["beyond"]),
            "downstream": summary["downstream"],
            "kept_tensors": summary["kept_tensors"],
            "kept_bytes": summary["kept_bytes"],
            "stats_s": round(stats_s, 3),
            "tensor_s": round(tensor_s, 3),
            "live_s": round(live_s, 3),
        }
    result["same_origin"] = result["origin_full"] == result["origin_live"] == result["origin_live_vs_tensor"]
    return {**result, **run_facts(load_start, os.getloadavg()[0])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument(
        "--fault", default=None, help="the faulty module (default: the middle layer's down_proj)"
    )
    parser.add_argument("--scale", type=float, default=1.001)
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"))
    args = parser.parse_args(argv)
    result = measure_live_disk(args.size, args.fault, args.scale, args.attn)
    mib = 1 << 20
    print(f"size {result['size']}, fault {result['fault']}")
    print(f"{'run':<8} {'disk MiB':>10} {'seconds':>8}  origin")
    print(
        f"{'tensor':<8} {result['tensor_bytes'] / mib:>10.2f} {result['tensor_s']:>8.2f}  {result['origin_full']}"
    )
    print(
        f"{'live':<8} {result['live_bytes'] / mib:>10.2f} {result['live_s']:>8.2f}  {result['origin_live']}"
    )
    print(f"{'stats':<8} {result['stats_bytes'] / mib:>10.2f} {result['stats_s']:>8.2f}")
    print(
        f"live keeps {result['kept_tensors']} tensors of {result['records']} records "
        f"({result['beyond']} beyond tolerance); disk ratio {result['live_disk_ratio']}x "
        f"(goal >= 10x); same origin: {result['same_origin']}"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
