"""What the in-graph statistics of a compiled stats-mode step cost, kernel by kernel variant
(issue 45, item 6: the micro-benchmark behind ``recording/compiled_stats.py``'s choices).

What it measures
    The distinct tensors a stats-mode recorder reads in one step of the Qwen2 of ``--size``
    (``benchmarks/_shared.py``), captured from one eager forward and backward: the forward's
    (every module's inputs and outputs, as ``InGraphStats`` takes them) and the backward's
    (the grad of every module output that requires grad, as ``compiled_grads.py`` takes them),
    each set timed apart (``forward_*``, ``backward_*``); then, for each variant of the statistics vector,
    one ``torch.compile``d function (inductor, CPU) that computes the vectors of all of them,
    timed in interleaved rounds (medians, wall and CPU seconds). Each distinct shape gets its
    own compiled function (one tensor of it timed, times the number of tensors of that shape:
    a step's statistics, without compiling a graph of all of them). The variants:

    ``read``     ``amax`` of the tensor as it is, nothing else: one read of every tensor, the
                 floor of any statistics that read each recorded tensor once
    ``f64``      every statistic on the tensor widened to float64, the counts by ``isnan`` and
                 ``isinf`` (the vector before this change: inductor's CPU code has no vector
                 ``isnan``/``isinf`` for float64, it stores each 16 values and tests them one by one)
    ``compares`` as ``f64``, the counts by ``w != w`` and ``|w| == inf`` (vectorised compares;
                 the vector of sessions 2-22, before max, min and counts moved to the tensor's dtype)
    ``native``   as ``compares``, max, min and the counts on the tensor as it is (exact in
                 its own dtype), only the sums on the float64 widening
    ``nocounts`` as ``f64`` without the two counts (to see what they cost)
    ``f32acc``   as ``native``, the sums accumulated in float32 (to see what float64 costs)
    ``current``  ``in_graph_vector.stats_vector_in_graph`` as it is in this checkout (since
                 session 23: blocks of 4 vectors of 16 lanes, each lane's 4 values summed in
                 float32, all six statistics from the same loads, the block sums in float64;
                 session 22's vector, sums on the float64 widening, is ``native``)

    Also reported: each variant's largest error of the mean (relative to the tensor's largest
    magnitude) and of the norm (relative) against torch's float64 sums (the documented bound:
    ``in_graph_vector.SUM_BOUND`` and ``NORM_BOUND``, which ``tests/recording/test_compiled_stats.py``
    holds them to).

    cd benchmarks && OMP_NUM_THREADS=1 python compiled_stats_kernels.py --size mid --rounds 7 \
        --variants read,native,current
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


def _read(t: torch.Tensor) -> torch.Tensor:
    return t.detach().amax().double().reshape(1)


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
    "read": _read,
    "f64": _f64,
    "compares": _compares,
    "native": _native,
    "nocounts": _nocounts,
    "f32acc": _f32acc,
    "current": stats_vector_in_graph,
}


def captured(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every distinct tensor among the module calls' inputs and outputs of one eager forward
    (one tensor that is a module's output and the next one's input is summarised once: the
    compiled graph's common-subexpression pass merges its statistics), and the grads of the
    outputs that require grad from its backward (detached copies)."""
    found: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    seen: dict[int, torch.Tensor] = {}  # id -> the tensor, kept alive so that ids stay unique

    def take(value: Any) -> None:
        for _, t in flatten(value, "x"):
            if t.numel() and id(t) not in seen:
                seen[id(t)] = t
                found.append(t.detach().clone())

    def take_out(value: Any) -> None:
        take(value)
        for _, t in flatten(value, "x"):
            if t.requires_grad and t.numel():
                t.register_hook(lambda g: grads.append(g.detach().clone()))

    for name, module in model.named_modules():
        if clean(name) and not is_wrapper(module):
            module.register_forward_pre_hook(lambda m, a, k: take((a, k)), with_kwargs=True)
            module.register_forward_hook(lambda m, a, k, o: take_out(o), with_kwargs=True)
    model(input_ids=ids, labels=ids).loss.backward()
    return found, grads


def _groups(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    """One floating tensor of each (shape, dtype) and how many of the tensors have it."""
    groups: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    for t in tensors:
        if t.is_floating_point():
            groups.setdefault((tuple(t.shape), t.dtype), []).append(t)
    return [ts[0] for ts in groups.values()], [len(ts) for ts in groups.values()]


def _errors(fns: list[Vector], reps: list[torch.Tensor]) -> tuple[float, float, float]:
    """The largest error of the mean (x max|x|), of the norm (relative) and of the mean in the
    units the compare judges a float32 mean in (a fraction of atol + rtol * |mean|: 1e-5 +
    1.3e-6 * |mean|, ``compare/tolerances.py``), against torch's float64 sums."""
    mean_err = norm_err = mean_tol = 0.0
    for fn, t in zip(fns, reps, strict=True):
        r = fn(t).tolist()
        if len(r) < 4:  # ``read``: no sums
            return 0.0, 0.0, 0.0
        wide = t.double()
        total, squares, top = wide.sum().item(), wide.square().sum().item(), t.abs().max().item()
        mean_err = max(mean_err, abs(r[2] - total) / (max(top, 1e-300) * t.numel()))
        norm_err = max(norm_err, abs(r[3] ** 0.5 - squares**0.5) / max(squares**0.5, 1e-300))
        mean_tol = max(mean_tol, abs(r[2] - total) / t.numel() / (1e-5 + 1.3e-6 * abs(total / t.numel())))
    return mean_err, norm_err, mean_tol


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
    sets = dict(zip(("forward", "backward"), captured(model, ids), strict=True))
    facts: dict[str, Any] = {"size": args.size}
    names = args.variants.split(",")
    kernels: dict[tuple[str, str], list[tuple[Vector, torch.Tensor, int]]] = {}
    for part, tensors in sets.items():
        reps, counts = _groups(tensors)
        facts[f"{part}_tensors"], facts[f"{part}_shapes"] = len(tensors), len(reps)
        facts[f"{part}_elements"] = sum(t.numel() for t in tensors)
        for name in names:
            began = time.perf_counter()
            fns = [torch.compile(VARIANTS[name], dynamic=False) for _ in reps]
            errors = _errors(fns, reps)
            facts[f"{part}_{name}_mean_err"], facts[f"{part}_{name}_norm_err"] = errors[:2]
            facts[f"{part}_{name}_mean_err_of_tolerance"] = errors[2]
            facts[f"{part}_{name}_compile_s"] = round(time.perf_counter() - began, 1)
            kernels[part, name] = list(zip(fns, reps, counts, strict=True))
    times: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in kernels}
    order = random.Random(0)
    keys = list(kernels)
    for _ in range(args.rounds):
        order.shuffle(keys)
        for key in keys:  # one step's statistics: each shape's kernel times its tensor count
            wall = cpu = 0.0
            for fn, t, count in kernels[key]:
                w, c = time.perf_counter(), time.process_time()
                fn(t)
                wall += (time.perf_counter() - w) * count
                cpu += (time.process_time() - c) * count
            times[key].append((wall, cpu))
    for (part, name), rows in times.items():
        facts[f"{part}_{name}_ms"] = round(1000 * statistics.median(r[0] for r in rows), 2)
        facts[f"{part}_{name}_cpu_ms"] = round(1000 * statistics.median(r[1] for r in rows), 2)
    facts["rounds"] = args.rounds
    facts.update(run_facts(load_start, os.getloadavg()[0]))
    for part in sets:
        print(f"{part}: {facts[f'{part}_tensors']} tensors, {facts[f'{part}_elements']} elements")
        for name in names:
            key = f"{part}_{name}"
            print(
                f"  {name:9s} {facts[f'{key}_ms']:8.2f} ms wall {facts[f'{key}_cpu_ms']:8.2f} ms CPU; "
                f"mean err {facts[f'{key}_mean_err']:.3g} x max|x|, norm rel err {facts[f'{key}_norm_err']:.3g}"
            )
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
