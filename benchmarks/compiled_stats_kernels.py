"""What the in-graph statistics of a compiled stats-mode step cost, kernel by kernel variant
(issue 45, item 6: the micro-benchmark behind ``recording/compiled_stats.py``'s choices).

What it measures
    The tensors a stats-mode recorder reads in one forward of the Qwen2 of ``--size``
    (``benchmarks/_shared.py``; every module's inputs and outputs, as ``InGraphStats`` takes
    them, captured from one eager forward), then, for each variant of the statistics vector,
    one ``torch.compile``d function (inductor, CPU) that computes the vectors of all of them,
    timed in interleaved rounds (medians, wall and CPU seconds). Each distinct shape gets its
    own compiled function (one tensor of it timed, times the number of tensors of that shape:
    a step's statistics, without compiling a graph of all of them). The variants:

    ``f64``      every statistic on the tensor widened to float64, the counts by ``isnan`` and
                 ``isinf`` (the vector before this change: inductor's CPU code has no vector
                 ``isnan``/``isinf`` for float64, it stores each 16 values and tests them one by one)
    ``compares`` as ``f64``, the counts by ``w != w`` and ``|w| == inf`` (vectorised compares)
    ``native``   as ``compares``, max, min and the counts on the tensor as it is (exact in
                 its own dtype), only the sums on the float64 widening
    ``nocounts`` as ``f64`` without the two counts (to see what they cost)
    ``f32acc``   as ``native``, the sums accumulated in float32 (to see what float64 costs)
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

from pytest_precalign.recording.in_graph_vector import stats_vector_in_graph
from pytest_precalign.recording.module_names import clean, is_wrapper
from pytest_precalign.recording.tensor_summary import flatten

Vector = Callable[[torch.Tensor], torch.Tensor]


def _f64(t: torch.Tensor) -> torch.Tensor:
    w = t.detach().to(torch.float64)
    return torch.stack(
        [w.amax(), w.amin(), w.sum(), (w * w).sum(), w.isnan().sum().double(), w.isinf().sum().double()]
    )


def _compares(t: torch.Tensor) -> torch.Tensor:
    w = t.detach().to(torch.float64)
    nan, inf = w != w, w.abs() == torch.inf
    return torch.stack([w.amax(), w.amin(), w.sum(), (w * w).sum(), nan.sum().double(), inf.sum().double()])


def _native(t: torch.Tensor) -> torch.Tensor:
    w = t.detach()
    wide = w.to(torch.float64)
    nan, inf = w != w, w.abs() == torch.inf
    return torch.stack(
        [
            w.amax().double(),
            w.amin().double(),
            wide.sum(),
            (wide * wide).sum(),
            nan.sum().double(),
            inf.sum().double(),
        ]
    )


def _nocounts(t: torch.Tensor) -> torch.Tensor:
    w = t.detach().to(torch.float64)
    return torch.stack([w.amax(), w.amin(), w.sum(), (w * w).sum()])


def _f32acc(t: torch.Tensor) -> torch.Tensor:
    w = t.detach()
    nan, inf = w != w, w.abs() == torch.inf
    return torch.stack([w.amax(), w.amin(), w.sum(), (w * w).sum(), nan.sum(), inf.sum()]).double()


VARIANTS: dict[str, Vector] = {
    "f64": _f64,
    "compares": _compares,
    "native": _native,
    "nocounts": _nocounts,
    "f32acc": _f32acc,
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
    groups: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    for t in tensors:
        if t.is_floating_point():
            groups.setdefault((tuple(t.shape), t.dtype), []).append(t)
    reps = [ts[0] for ts in groups.values()]  # one tensor of each shape, its statistics timed
    counts = [len(ts) for ts in groups.values()]
    facts: dict[str, Any] = {
        "size": args.size,
        "tensors": len(tensors),
        "shapes": len(reps),
        "elements": sum(t.numel() for t in tensors),
    }
    names = args.variants.split(",")
    fns = {(n, i): torch.compile(VARIANTS[n], dynamic=False) for n in names for i in range(len(reps))}
    for name in names:
        began = time.perf_counter()
        rows = [fns[name, i](t).tolist() for i, t in enumerate(reps)]
        facts[f"{name}_compile_s"] = round(time.perf_counter() - began, 1)
        # the test's rule: |mean - mean_ref| / max|x| and the norm's relative error, against
        # torch's float64 sums
        mean_err = norm_err = 0.0
        for r, t in zip(rows, reps, strict=True):
            total, squares, top = (
                t.double().sum().item(),
                t.double().square().sum().item(),
                t.abs().max().item(),
            )
            mean_err = max(mean_err, abs(r[2] - total) / (max(top, 1e-300) * t.numel()))
            norm_err = max(norm_err, abs(r[3] ** 0.5 - squares**0.5) / max(squares**0.5, 1e-300))
        facts[f"{name}_mean_err"], facts[f"{name}_norm_err"] = mean_err, norm_err
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    order = random.Random(0)
    for _ in range(args.rounds):
        order.shuffle(names)
        for name in names:  # one step's statistics: each shape's kernel times its tensor count
            wall = cpu = 0.0
            for i, t in enumerate(reps):
                w, c = time.perf_counter(), time.process_time()
                fns[name, i](t)
                wall += (time.perf_counter() - w) * counts[i]
                cpu += (time.process_time() - c) * counts[i]
            times[name].append((wall, cpu))
    for name, rows in times.items():
        facts[f"{name}_ms"] = round(1000 * statistics.median(r[0] for r in rows), 2)
        facts[f"{name}_cpu_ms"] = round(1000 * statistics.median(r[1] for r in rows), 2)
    facts["rounds"] = args.rounds
    facts.update(run_facts(load_start, os.getloadavg()[0]))
    for name in sorted(names):
        print(
            f"{name:9s} {facts[f'{name}_ms']:8.2f} ms wall {facts[f'{name}_cpu_ms']:8.2f} ms CPU; "
            f"mean err {facts[f'{name}_mean_err']:.3g} x max|x|, norm rel err {facts[f'{name}_norm_err']:.3g}"
        )
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
