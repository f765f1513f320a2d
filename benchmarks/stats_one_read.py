"""One tensor's statistics (max, min, sum, L2 norm) by the CPU paths issue #35 weighed:

* ``reference`` -- the one-call reductions: ``aminmax``, ``sum``, ``vector_norm`` (three
  reads of the tensor);
* ``dot`` -- ``aminmax``, ``sum`` and ``torch.dot(x, x)`` (BLAS) for the sum of squares;
* ``pieces`` -- ``chunked_stats.chunked_values``: the tensor read once from memory in
  L2-sized pieces, three reductions per piece while it is in cache (what ``stats_vector``
  uses above ``CHUNKED_NUMEL`` elements);
* ``native`` -- ``native_kernels.stats``: the C kernel the platform's compiler builds (one
  read; what ``stats_vector`` uses on the CPU where one is built); its build time from a cold
  cache (a temporary ``PRECALIGN_CACHE_DIR``) is printed apart (``native_build_s``);
* zero counts of the same tensors (the scalars mode's ``zero_grads``): ``count_nonzero``
  against ``native_kernels.zeros`` (printed as ``zeros``);
* ``compiled`` (``--compile``) -- one fused ``torch.compile`` kernel (inductor, C++ on the
  CPU); its compile time is printed apart;
* after a large operation (``after_matmul``): a 512-element tensor's statistics right after a
  512x512 @ 512x1408 matmul, as a hook meets them (the interpreter's own data pushed out of the
  caches), by ``cpu_stats`` and by a recorder's ``stats_reader``, and a second call at once
  (warm); the median of 400 wall times, in us, at torch's own thread count.

On a 2048 x 32000 fp32 tensor (the logits of a 32K vocabulary, 262 MB) and on the distinct
tensors one recorded mid Qwen2 step summarises (their sizes, random values: copies are cold
in cache where a step's own tensors are often hot, so this favours ``pieces``; read it for
the large ones). One torch thread, as ``stats_vector`` runs; the best of ``--rounds`` of each
path's process CPU time (a loaded machine disturbs it less than wall time), in ms.

    .venv/bin/python benchmarks/stats_one_read.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from _shared import SIZES, Read, build_qwen2, run_facts, stats_reads

from pytest_precalign.recording import HookRecorder, native_kernels, tensor_summary
from pytest_precalign.recording.chunked_stats import chunked_values

Path = Callable[[torch.Tensor], object]


def reference(t: torch.Tensor) -> object:
    mn, mx = torch.aminmax(t)
    return mx, mn, t.sum(dtype=torch.float32), torch.linalg.vector_norm(t, dtype=torch.float32)


def dot(t: torch.Tensor) -> object:
    flat = t.reshape(-1)
    mn, mx = torch.aminmax(flat)
    return mx, mn, flat.sum(), torch.dot(flat, flat).sqrt()


def pieces(t: torch.Tensor) -> object:
    return chunked_values(t, torch.float32)


def step_sizes() -> list[int]:
    """The element counts of the distinct tensors one recorded mid step summarises."""
    size = SIZES["mid"]
    model = build_qwen2(size, "sdpa")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    seen: list[int] = []

    def counting(read: Read) -> Read:
        def count(data: torch.Tensor) -> Any:
            seen.append(data.numel())
            return read(data)

        return count

    with stats_reads(counting), HookRecorder(model, mode="stats", inputs=True, grads=True):
        model(input_ids=ids, labels=ids).loss.backward()
    assert seen, "no tensor summarised: the recorder's statistics seam moved"
    return seen


def best_ms(path: Path, tensors: list[torch.Tensor], rounds: int) -> float:
    for t in tensors[:3]:
        path(t)
    times = []
    for _ in range(rounds):
        start = time.process_time()
        for t in tensors:
            path(t)
        times.append(time.process_time() - start)
    return round(min(times) * 1e3, 2)


def after_matmul() -> dict[str, float]:
    """A small tensor's statistics right after a matmul (cold) and again at once (warm)."""
    a, b, small = torch.randn(512, 512), torch.randn(512, 1408), torch.randn(512)
    out: dict[str, float] = {}
    for name, read in (
        ("cpu_stats", tensor_summary.cpu_stats),
        ("stats_reader", tensor_summary.stats_reader()),
    ):
        cold, warm = [], []
        for _ in range(400):
            a @ b
            start = time.perf_counter()
            read(small)
            middle = time.perf_counter()
            read(small)
            cold.append(middle - start)
            warm.append(time.perf_counter() - middle)
        out[f"after_matmul_{name}_us"] = round(statistics.median(cold) * 1e6, 1)
        out[f"warm_{name}_us"] = round(statistics.median(warm) * 1e6, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also time a torch.compile'd fused kernel")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as cold:  # before anything loads it from the usual cache
        os.environ["PRECALIGN_CACHE_DIR"] = cold
        start = time.perf_counter()
        assert native_kernels.kernel_state() == "native", native_kernels.kernel_state()
        build_s = round(time.perf_counter() - start, 2)
        native_kernels.stats(torch.ones(4))  # loaded now: the cache may go
    del os.environ["PRECALIGN_CACHE_DIR"]
    print(f"native kernel (float32 statistics) built from a cold cache in {build_s} s", flush=True)
    cold = after_matmul()
    print(
        "512 elements right after a matmul: cpu_stats {after_matmul_cpu_stats_us} us, stats_reader "
        "{after_matmul_stats_reader_us} us (at once again: {warm_cpu_stats_us} / {warm_stats_reader_us} us)".format(
            **cold
        ),
        flush=True,
    )
    sizes = step_sizes()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(2048, 32000, generator=gen)]
    step = [torch.randn(n, generator=gen) for n in sizes]
    large = [t for t in step if t.numel() > (1 << 21)]
    paths: dict[str, Path] = {
        "reference": reference,
        "dot": dot,
        "pieces": pieces,
        "native": native_kernels.stats,
    }
    out: dict[str, object] = {
        "step_tensors": len(step),
        "step_elements": sum(sizes),
        "large_in_step": len(large),
        "native_build_s": build_s,
        **cold,
    }
    if args.compile:
        from pytest_precalign.recording.fused_stats import _six

        start = time.perf_counter()
        fused = torch.compile(_six, dynamic=True)
        fused(logits[0])
        out["compile_s"] = round(time.perf_counter() - start, 1)
        paths["compiled"] = fused
    for name, path in paths.items():
        out[f"{name}_logits_ms"] = best_ms(path, logits, args.rounds)
        out[f"{name}_step_large_ms"] = best_ms(path, large, args.rounds)
        small = [t for t in step if t.numel() <= (1 << 21)]
        out[f"{name}_step_rest_ms"] = best_ms(path, small, args.rounds)
        print(
            f"{name:10s} 2048x32000: {out[f'{name}_logits_ms']:8.2f} ms   mid step, {len(large)} large: "
            f"{out[f'{name}_step_large_ms']:8.2f} ms, {len(small)} others: {out[f'{name}_step_rest_ms']:8.2f} ms",
            flush=True,
        )
    small = [t for t in step if t.numel() <= (1 << 21)]
    for name, count in (("count_nonzero", torch.count_nonzero), ("native_zeros", native_kernels.zeros)):
        out[f"{name}_step_ms"] = best_ms(count, large + small, args.rounds)
    print(
        f"zeros      mid step, all {len(step)}: count_nonzero {out['count_nonzero_step_ms']:8.2f} ms, "
        f"native {out['native_zeros_step_ms']:8.2f} ms",
        flush=True,
    )
    torch.set_num_threads(threads)
    out.update(run_facts(load_start, os.getloadavg()[0]))
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
