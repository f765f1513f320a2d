"""What recording a ``torch.compile``d step in stats mode costs (issue 45, item 6).

What it measures
    One forward+backward of a ``transformers.Qwen2ForCausalLM`` (fp32, CPU, seed 0, nothing
    downloaded; ``labels=input_ids``) compiled by ``torch.compile`` (inductor unless
    ``--backend``), with and without a stats-mode ``HookRecorder``. Under compile stats mode
    computes its statistics inside the compiled graph (``recording/compiled_stats.py``): a
    recorded step runs the variant of the graph compiled with them, an unrecorded one the
    variant without them; both are compiled in the warm-up (their compile times reported).

    Variants, interleaved each round in a seeded random order: ``bare`` (the compiled step)
    and ``stats`` (``HookRecorder.__enter__`` .. forward .. backward .. ``__exit__``, which
    fetches the step's statistics in one host sync; ``trace()`` timed apart, as
    ``trace_s``). Grads are set to None and ``gc.collect()`` runs outside the timed region.
    Reported: medians, the median of the per-round paired ratios stats/bare (wall and CPU
    time: the process's CPU seconds, which a loaded machine disturbs less), dynamo's graph
    and break counts of each variant's compile, whether loss and every grad are bitwise equal,
    the host syncs per recorded step, and each variant's median forward, backward (the
    parameter grads' hooks run in it) and rest (the recorder's enter and exit) seconds.

Goal: the paired ratio <= 1.05 at the mid size (``benchmarks/_shared.py``).

    python benchmarks/compile_overhead.py --size mid --rounds 9
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time
from typing import Any

import torch
from _shared import SIZES, build_qwen2, run_facts
from torch._dynamo.utils import counters

from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.compiled_stats import in_graph_stats
from pytest_precalign.recording.host_sync import host_syncs


def _counts() -> tuple[int, int]:
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--attn", default="sdpa")
    args = parser.parse_args()
    size = SIZES[args.size]
    load_start = os.getloadavg()[0]
    model = build_qwen2(size, args.attn)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    in_graph_stats(model)  # the in-graph hooks exist before the first compile, as Recorder.start adds them
    compiled = torch.compile(model, backend=args.backend)

    sections: dict[str, list[tuple[float, float, float]]] = {"bare": [], "stats": []}

    def step(record: bool) -> tuple[float, float, float, Any]:
        model.zero_grad(set_to_none=True)
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        rec = HookRecorder(compiled, mode="stats") if record else None
        if rec is not None:
            rec.__enter__()
        began = time.perf_counter()
        loss = compiled(input_ids=ids, labels=ids).loss
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        if rec is not None:
            rec.__exit__(None, None, None)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        # the forward, the backward (the parameter grads' hooks in it), and the rest (enter, exit)
        sections["stats" if record else "bare"].append(
            (forward - began, backward - forward, wall - (backward - began))
        )
        traced = time.perf_counter()
        records = len(rec.trace({}).records) if rec is not None else 0
        return wall, cpu, time.perf_counter() - traced, (loss.detach(), records)

    facts: dict[str, Any] = {"size": args.size, "backend": args.backend}
    grads: dict[str, dict[str, torch.Tensor]] = {}
    losses: dict[str, torch.Tensor] = {}
    for name, record in (("bare", False), ("stats", True)):  # warm-up: each variant compiled once
        before = _counts()
        began = time.perf_counter()
        syncs = host_syncs()
        _, _, _, (loss, records) = step(record)
        facts[f"compile_{name}_s"] = round(time.perf_counter() - began, 1)
        after = _counts()
        facts[f"graphs_{name}"], facts[f"breaks_{name}"] = after[0] - before[0], after[1] - before[1]
        losses[name] = loss
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        if record:
            facts["records"] = records
            facts["host_syncs_per_step"] = host_syncs() - syncs
    facts["bitwise_equal"] = bool(torch.equal(losses["bare"], losses["stats"])) and all(
        torch.equal(grads["bare"][n], grads["stats"][n]) for n in grads["bare"]
    )
    times: dict[str, list[tuple[float, float, float]]] = {"bare": [], "stats": []}
    for rows in sections.values():  # the warm-up's compiles are not a section's time
        rows.clear()
    order = random.Random(0)
    for _ in range(args.rounds):
        variants = ["bare", "stats"]
        order.shuffle(variants)
        for name in variants:
            wall, cpu, traced, _ = step(name == "stats")
            times[name].append((wall, cpu, traced))
    facts["graphs_after_rounds"], facts["breaks_after_rounds"] = _counts()
    for name, rows in times.items():
        facts[f"{name}_s"] = round(statistics.median(r[0] for r in rows), 4)
        facts[f"{name}_cpu_s"] = round(statistics.median(r[1] for r in rows), 4)
    for name, rows in sections.items():  # medians of the forward, the backward, the rest
        for i, part in enumerate(("forward", "backward", "rest")):
            facts[f"{name}_{part}_s"] = round(statistics.median(r[i] for r in rows), 4)
    facts["trace_s"] = round(statistics.median(r[2] for r in times["stats"]), 4)
    pairs = list(zip(times["bare"], times["stats"], strict=True))
    facts["paired_ratio"] = round(statistics.median(s[0] / b[0] for b, s in pairs), 4)
    facts["paired_cpu_ratio"] = round(statistics.median(s[1] / b[1] for b, s in pairs), 4)
    facts["rounds"] = args.rounds
    facts.update(run_facts(load_start, os.getloadavg()[0]))
    print(
        f"{args.size} {args.backend}: bare {facts['bare_s']} s, stats {facts['stats_s']} s; paired ratio "
        f"{facts['paired_ratio']} (CPU {facts['paired_cpu_ratio']}); graphs/breaks bare "
        f"{facts['graphs_bare']}/{facts['breaks_bare']}, stats {facts['graphs_stats']}/{facts['breaks_stats']}; "
        f"bitwise {facts['bitwise_equal']}"
    )
    print(
        "forward / backward / rest s: "
        + "; ".join(
            f"{name} {facts[f'{name}_forward_s']} / {facts[f'{name}_backward_s']} / {facts[f'{name}_rest_s']}"
            for name in ("bare", "stats")
        )
    )
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
