"""bfloat16 compare: raw bits widened per chunk (``Trace.raw_array``) vs widened up front.

What it measures
    Two tensor-mode traces of one forward+backward of the mid (or ``--size``) Qwen2 from
    ``_shared.py`` cast to bfloat16 (seed 0, ``labels=input_ids``), the target with
    ``model.layers.4.mlp.down_proj.weight`` x 1.01, written with ``write_trace`` into
    ``--workdir`` (reused while it holds them). Then ``compare_runs`` in this process,
    interleaved over ``--rounds`` rounds after one warm-up: ``raw`` (main's path) and
    ``widened`` (``Trace.raw_array`` replaced by the widen-up-front ``Trace.array``).

Output
    Per variant the median and min seconds, the first divergence of each (they must agree), and
    as the last line one JSON object (``raw_s``, ``widened_s``, ``same_verdicts``).

Reproduce (from the repository root)::

    python benchmarks/bf16_compare.py --rounds 3 --workdir /tmp/precalign-bf16-bench
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from _shared import SIZES, build_qwen2

from pytest_precalign.recording import HookRecorder as Recorder
from pytest_precalign.run.offline import compare_runs
from pytest_precalign.trace.native_io import write_trace
from pytest_precalign.trace.records import Trace


def build(workdir: Path, size_name: str) -> None:
    if (workdir / "target" / "manifest.json").is_file():
        return
    size = SIZES[size_name]
    model = build_qwen2(size, "sdpa").to(torch.bfloat16)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    for name in ("golden", "target"):
        if name == "target":
            with torch.no_grad():
                model.model.layers[4].mlp.down_proj.weight.mul_(1.01)
        model.zero_grad(set_to_none=True)
        with Recorder(model, mode="tensor") as rec:
            model(input_ids=ids, labels=ids).loss.backward()
        write_trace(rec.trace({}), workdir / name, overwrite=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/precalign-bf16-bench"))
    args = parser.parse_args(argv)
    build(args.workdir, args.size)
    golden, target = args.workdir / "golden", args.workdir / "target"
    raw_array = Trace.raw_array
    times: dict[str, list[float]] = {"raw": [], "widened": []}
    first: dict[str, str | None] = {}
    try:
        for round_ in range(args.rounds + 1):
            for variant in times:
                Trace.raw_array = (  # type: ignore[method-assign]
                    raw_array if variant == "raw" else (lambda self, rec: (self.array(rec), False))
                )
                start = time.perf_counter()
                run = compare_runs(golden, target)
                seconds = time.perf_counter() - start
                if round_:
                    times[variant].append(seconds)
                found = run.verdicts["forward"].first
                first[variant] = found.name if found else None
    finally:
        Trace.raw_array = raw_array  # type: ignore[method-assign]
    for variant, values in times.items():
        print(
            f"{variant:8s} median {statistics.median(values):.3f} s  min {min(values):.3f} s  first {first[variant]}"
        )
    print(
        json.dumps(
            {
                "raw_s": round(statistics.median(times["raw"]), 4),
                "widened_s": round(statistics.median(times["widened"]), 4),
                "same_verdicts": first["raw"] == first["widened"],
                "first_divergence": first["raw"],
                "rounds": args.rounds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
