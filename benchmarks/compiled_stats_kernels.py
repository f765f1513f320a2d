"""What the in-graph statistics of a compiled stats-mode step cost, kernel by kernel variant
(issue 45, item 6: the micro-benchmark behind ``recording/compiled_stats.py``'s choices).

What it measures
    The tensors a stats-mode recorder reads in one forward of the Qwen2 of ``--size``
    (``benchmarks/_shared.py``; every module's inputs and outputs, as ``InGraphStats`` takes
    them, captured from one eager forward), then, for each variant of the statistics vector,
    one ``torch.compile``d function (inductor, CPU) that computes the vectors of all of them,
    timed in interleaved rounds (medians, wall and CPU seconds). The variants:

    ``f64``      every statistic on the tensor widened to float64 (the vector before this change)
    ``native``   max, min and the NaN/Inf counts on the tensor as it is (exact in its own
                 dtype), the sum and the sum of squares accumulated in float64
    ``f32acc``   as ``native``, the sums accumulated in float32 (to see what float64 costs)
    ``nocounts`` as ``native`` without the two counts (to see what they cost)
    ``current``  ``compiled_stats.stats_vector_in_graph`` as it is in this checkout

    Also reported: each variant's largest error of the mean (relative to the tensor's largest
    magnitude) and of the norm (relative) against torch's float64 sums, the rule
    ``tests/recording/test_compiled_stats.py`` holds them to.

    python benchmarks/compiled_stats_kernels.py --size mid --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _shared import SIZES, build_qwen2, run_facts

from pytest_precalign.recording.compiled_stats import stats_vector_in_graph
from pytest_precalign.recording.module_names import clean, is_wrapper
from pytest_precalign.recording.tensor_summary import flatten

Vector = Callable[[torch.Tensor], torch.Tensor]


def _f64(t: torch.Tensor) -> torch.Tensor:
    w = t.detach().to(torch.float64)
    return torch.stack(
        [w.amax(), w.amin(), w.sum(), (w * w).sum(), w.isnan().sum().double(), w.isinf().sum().double()]
    )


def _native(acc: torch.dtype, counts: bool) -> Vector:
    def vector(t: torch.Tensor) -> torch.Tensor:
        w = t.detach()
        wide = w.to(acc)
        parts = [w.amax().double(), w.amin().double(), wide.sum().double(), (wide * wide).sum().double()]
        if counts:
            parts += [w.isnan().sum().double(), w.isinf().sum().double()]
        return torch.stack(parts)

    return vector


VARIANTS: dict[str, Vector] = {
    "f64": _f64,
    "native": _native(torch.float64, True),
    "f32acc": _native(torch.float32, True),
    "nocounts": _native(torch.float64, False),
    "current": stats_vector_in_graph,
}


def captured(model: torch.nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every module call's inputs and outputs of one eager forward (detached copies)."""
    found: list[torch.Tensor] = []

    def take(value: Any) -> None:
        found.extend(t.detach().clone() for _, t in flatten(value, "x") if t.numel())

    for name, module in model.named_modules():
        if clean(name) and not is_wrapper(module):
            module.register_forward_pre_hook(lambda m, a, k: take((a, k)), with_kwargs=True)
            module.register_forward_hook(lambda m, a, k, o: take(o), with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids, labels=ids)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    size = SIZES[args.size]
    load_start = os.getloadavg()[0]
    model = build_qwen2(size, "sdpa")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    tensors = captured(model, ids)
    floats = [t for t in tensors if t.is_floating_point()]
    reference = [
        (t.double().sum().item(), t.double().square().sum().item(), t.abs().max().item()) for t in floats
    ]
    facts: dict[str, Any] = {
        "size": args.size,
        "tensors": len(tensors),
        "elements": sum(t.numel() for t in tensors),
    }
    fns = {}
    for name in args.variants.split(","):
        vector = VARIANTS[name]
        fn = torch.compile(lambda ts, vector=vector: torch.stack([vector(t) for t in ts]))
        began = time.perf_counter()
        rows = fn(floats).tolist()
        facts[f"{name}_compile_s"] = round(time.perf_counter() - began, 1)
        pairs = list(zip(rows, reference, floats, strict=True))
        # the test's rule: |mean - mean_ref| / max|x| and the norm's relative error
        facts[f"{name}_mean_err"] = max(
            abs(r[2] - s) / (max(m, 1e-300) * t.numel()) for r, (s, _, m), t in pairs
        )
        facts[f"{name}_norm_err"] = max(
            abs(r[3] ** 0.5 - q**0.5) / max(q**0.5, 1e-300) for r, (_, q, _), _t in pairs
        )
        fns[name] = fn
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    order = random.Random(0)
    for _ in range(args.rounds):
        names = list(fns)
        order.shuffle(names)
        for name in names:
            wall, cpu = time.perf_counter(), time.process_time()
            fns[name](floats).tolist()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    for name, rows in times.items():
        facts[f"{name}_ms"] = round(1000 * statistics.median(r[0] for r in rows), 2)
        facts[f"{name}_cpu_ms"] = round(1000 * statistics.median(r[1] for r in rows), 2)
    facts["rounds"] = args.rounds
    facts.update(run_facts(load_start, os.getloadavg()[0]))
    for name in fns:
        print(
            f"{name:9s} {facts[f'{name}_ms']:8.2f} ms wall {facts[f'{name}_cpu_ms']:8.2f} ms CPU; "
            f"mean err {facts[f'{name}_mean_err']:.3g} x max|x|, norm rel err {facts[f'{name}_norm_err']:.3g}"
        )
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
