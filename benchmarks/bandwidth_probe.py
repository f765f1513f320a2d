"""The machine's own memory bandwidth, as numpy sees it: max |a - b| of two large fp32 arrays.

What it measures
    Two float32 arrays of ``--mib`` MiB each (default 512, random, so nothing compresses or
    stays in cache), then ``float(np.abs(a - b).max())``, best of ``--rounds``: GB/s of input
    (both arrays' bytes / seconds). This is the reference ``benchmarks/vs_msprobe.py`` divides
    the in-process compare's throughput by (``compare_bandwidth_fraction``), measured in the
    same run. The same reduction over cache-sized chunks (32K elements, one reused buffer) is
    printed beside it: how fast a pass that reads each byte once can go on this machine.

Output
    One line per variant, then as the LAST line one JSON object (``probe_gbps``,
    ``probe_chunked_gbps``, ``mib``, ``rounds``, load averages).

Reproduce::

    python benchmarks/bandwidth_probe.py --mib 512 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

CHUNK = 1 << 15


def _arrays(mib: int) -> tuple[np.ndarray, np.ndarray]:
    n = mib * 2**20 // 4
    rng = np.random.default_rng(0)
    return rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)


def _plain(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max())


def _chunked(a: np.ndarray, b: np.ndarray) -> float:
    buf = np.empty(CHUNK, dtype=a.dtype)
    best = 0.0
    for start in range(0, a.size, CHUNK):
        d = np.subtract(
            a[start : start + CHUNK], b[start : start + CHUNK], out=buf[: min(CHUNK, a.size - start)]
        )
        np.abs(d, out=d)
        best = max(best, float(d.max()))
    return best


def _best_gbps(
    fn: Callable[[np.ndarray, np.ndarray], float], a: np.ndarray, b: np.ndarray, rounds: int
) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn(a, b)
        best = min(best, time.perf_counter() - start)
    return (a.nbytes + b.nbytes) / best / 1e9


def bandwidth_probe(mib: int = 512, rounds: int = 5) -> dict[str, float]:
    """``probe_gbps``: GB/s of input of numpy's ``max |a - b|`` over two ``mib`` MiB fp32
    arrays, best of ``rounds``; ``probe_chunked_gbps``: the same over 32K-element chunks."""
    a, b = _arrays(mib)
    plain = _best_gbps(_plain, a, b, rounds)
    chunked = _best_gbps(_chunked, a, b, rounds)
    return {"probe_gbps": round(plain, 3), "probe_chunked_gbps": round(chunked, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=512, help="size of each array (default 512 MiB)")
    parser.add_argument("--rounds", type=int, default=5, help="best of this many (default 5)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    found = bandwidth_probe(args.mib, args.rounds)
    load_end = os.getloadavg()[0]
    print(
        f"numpy max |a - b|, 2 x {args.mib} MiB fp32: {found['probe_gbps']:.2f} GB/s of input (best of {args.rounds})"
    )
    print(f"the same over {CHUNK}-element chunks: {found['probe_chunked_gbps']:.2f} GB/s")
    print(f"1-min load average: {load_start:.2f} at start, {load_end:.2f} at end ({os.cpu_count()} CPUs)")
    print(
        json.dumps(
            {
                **found,
                "mib": args.mib,
                "rounds": args.rounds,
                "loadavg_start": load_start,
                "loadavg_end": load_end,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
