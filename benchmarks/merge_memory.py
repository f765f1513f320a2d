"""Peak memory of ``precalign compare`` on multi-rank sides merged lazily.

What it measures
    Two sides of one synthetic Megatron-shaped run, written as ``step0/rank<R>/`` trace
    folders with ``parallel`` manifests (fp32; per layer: ``linear_qkv`` and ``linear_fc1``
    outputs, ``linear_fc2`` input and output, the fc1 and fc2 weights, named and sharded as
    the Megatron rules say; ``--layers`` layers of ``--tokens`` tokens, hidden ``--hidden``):

    * golden -- ``--golden-layout`` (default TP=8 on 8 ranks);
    * target -- ``--target-layout`` (default TP=4 x PP=2 on 8 ranks), the same tensors.

    Then ``precalign compare golden target`` runs in a subprocess (once per
    ``PRECALIGN_COMPARE_THREADS`` value in ``--threads``); the compare process reports its
    own peak RSS (``VmHWM`` of ``/proc/self/status``, which starts afresh at exec, unlike
    ``ru_maxrss`` of a child forked from this large process) as it exits, beside that of the
    interpreter with the CLI imported only. The bound: the largest merged tensor pair + 100 MB.

Run: ``python benchmarks/merge_memory.py`` (about 1 GB per side in ``--workdir``, default a
temporary folder, removed after). Prints one JSON line per compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pytest_precalign.parallel.layout import ParallelLayout
from pytest_precalign.parallel.rules import rule_for
from pytest_precalign.trace.native_io import write_trace
from pytest_precalign.trace.records import Record, Trace

MB = 1 << 20


def layer_tensors(
    layer: int, tokens: int, hidden: int, seed: int
) -> dict[tuple[str, str, str], torch.Tensor]:
    """(name, kind, slot) -> the TP=1 tensor, for one layer."""
    g = torch.Generator().manual_seed(seed + layer)
    p = f"decoder.layers.{layer}"
    shapes = {
        (f"{p}.self_attention.linear_qkv", "activation", "out.0"): (tokens, 1, 3 * hidden),
        (f"{p}.mlp.linear_fc1", "activation", "out.0"): (tokens, 1, 8 * hidden),
        (f"{p}.mlp.linear_fc2", "input", "in.0"): (tokens, 1, 4 * hidden),
        (f"{p}.mlp.linear_fc2", "activation", "out.0"): (tokens, 1, hidden),
        (f"{p}.mlp.linear_fc1.weight", "param_grad", ""): (8 * hidden, hidden),
        (f"{p}.mlp.linear_fc2.weight", "param_grad", ""): (hidden, 4 * hidden),
    }
    return {key: torch.randn(shape, generator=g) for key, shape in shapes.items()}


def _shard(full: torch.Tensor, record: Record, tp: int, rank: int) -> torch.Tensor:
    rule = rule_for(record)
    if rule is None or rule.layout == "replicated" or tp == 1:
        return full
    dim = rule.dim % full.dim()
    if rule.layout == "chunk":
        return full.chunk(tp, dim)[rank].contiguous()
    gate, up = full.chunk(2, dim)
    return torch.cat([gate.chunk(tp, dim)[rank], up.chunk(tp, dim)[rank]], dim).contiguous()


def write_side(root: Path, layout: ParallelLayout, args: argparse.Namespace) -> tuple[int, float]:
    """Writes every rank folder; returns (largest merged tensor bytes, side GB)."""
    per_stage = args.layers // layout.pp
    largest, total = 0, 0
    ranks: dict[int, tuple[list[Record], dict[str, torch.Tensor]]] = {
        r: ([], {}) for r in range(layout.world_size)
    }
    for layer in range(args.layers):
        for (name, kind, slot), full in layer_tensors(layer, args.tokens, args.hidden, 0).items():
            largest = max(largest, full.numel() * 4)
            total += full.numel() * 4
            stage, local = divmod(layer, per_stage)
            local_name = name.replace(f"layers.{layer}", f"layers.{local}", 1)
            phase = "forward" if kind in ("activation", "input") else "backward"
            for rank in range(layout.world_size):
                c = layout.coords(rank)
                if c["pp"] != stage:
                    continue
                records, tensors = ranks[rank]
                probe = Record(0, name, "Linear", phase, 0, 0, kind, slot, "float32", tuple(full.shape))
                shard = _shard(full, probe, layout.tp, c["tp"])
                key = f"t{len(tensors)}"
                tensors[key] = shard
                rec = Record(
                    len(records), local_name, "Linear", phase, 0, 0, kind, slot, "float32", tuple(shard.shape)
                )
                records.append(_with_stats(rec, shard, key))
    for rank, (records, tensors) in ranks.items():
        block = _block(layout, rank, per_stage)
        write_trace(
            Trace({"record_mode": "tensor", "parallel": block}, tuple(records), tensors),
            root / "step0" / f"rank{rank}",
        )
    return largest, total / 1e9


def _with_stats(rec: Record, t: torch.Tensor, key: str) -> Record:
    from dataclasses import replace

    from pytest_precalign.recording.tensor_summary import tensor_stats

    return replace(rec, stats=tensor_stats(t), tensor_key=key)


def _block(layout: ParallelLayout, rank: int, per_stage: int) -> dict[str, Any]:
    c = layout.coords(rank)
    return {
        "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "cp": 1, "ep": 1, "vpp": None,
        "world_size": layout.world_size, "rank": rank, **{f"{d}_rank": c[d] for d in c},
        "order": layout.order, "source": "megatron", "sequence_parallel": False,
        "chunks": [{"index": 0, "prefix": "", "layer_offsets": {"decoder.layers": c["pp"] * per_stage}}],
        "sharding": {},
    }  # fmt: skip


def _layout(text: str) -> ParallelLayout:
    values = dict(item.split("=") for item in text.split(","))
    return ParallelLayout(**{k: int(v) for k, v in values.items()})


_CHILD = (
    "import sys\n"
    "from pytest_precalign.cli import main\n"
    "code = main(sys.argv[1:]) if len(sys.argv) > 1 else 0\n"
    "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
    "print('PEAK_KIB', hwm, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def measure(golden: Path | None, target: Path | None, threads: str) -> dict[str, Any]:
    """Peak RSS of one ``precalign compare`` process (its own getrusage at exit); with no
    sides, of the interpreter with the CLI imported."""
    env = {k: v for k, v in os.environ.items() if k != "PRECALIGN_COMPARE_THREADS"}
    if threads != "default":
        env["PRECALIGN_COMPARE_THREADS"] = threads
    cmd = [sys.executable, "-c", _CHILD]
    if golden is not None and target is not None:
        cmd += ["compare", str(golden), str(target)]
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - started
    peaks = [int(line.split()[1]) for line in out.stderr.splitlines() if line.startswith("PEAK_KIB ")]
    if out.returncode != 0 or not peaks:
        raise SystemExit(f"compare failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return {"threads": threads, "peak_rss_mb": round(peaks[0] / 1024, 1), "seconds": round(seconds, 2),
            "summary": out.stdout.strip().splitlines()}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--golden-layout", default="tp=8")
    parser.add_argument("--target-layout", default="tp=4,pp=2")
    parser.add_argument(
        "--threads",
        default="default,1,2",
        help="PRECALIGN_COMPARE_THREADS values, in order ('default': unset; merged sides then use 1)",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="precalign-merge-mem-"))
    try:
        largest, gb = write_side(work / "golden", _layout(args.golden_layout), args)
        write_side(work / "target", _layout(args.target_layout), args)
        bound = 2 * largest / MB + 100
        idle = measure(None, None, "default")["peak_rss_mb"]
        for threads in args.threads.split(","):
            row = measure(work / "golden", work / "target", threads)
            row.update(
                cli_import_rss_mb=idle,
                side_gb=round(gb, 3),
                largest_tensor_mb=round(largest / MB, 1),
                bound_mb=round(bound, 1),
            )
            row.update(
                golden=args.golden_layout, target=args.target_layout, within_bound=row["peak_rss_mb"] <= bound
            )
            print(json.dumps(row), flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
