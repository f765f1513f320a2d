"""What ``StepEvidence`` itself costs a training step, in this process's CPU time.

A real step of the ``--size`` Qwen2 as ``training_overhead.py`` runs it (2 micro-batches,
clipping, AdamW, LambdaLR), ``--rounds`` times after one warm-up, on ``--threads`` torch
threads (default 1: a loaded machine disturbs one thread's CPU time least). Timed apart in
each step: the whole step without evidence (``bare``), and the evidence's own calls of a
recorded step that follows a recorded step, as in a run recorded at every step (``begin``,
which takes the snapshot the last step's norms left, ``grads_before_clip`` with the framework's norm,
``grads_after_clip``, ``finish``: the snapshot, the zero count, the norm after clipping, the
update and parameter norms). Printed: the medians, the evidence over the bare step, and one
JSON line (with the load average). Writes nothing.

    .venv/bin/python benchmarks/evidence_cost.py --size mid --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from _shared import SIZES, run_facts
from training_overhead import Run

from pytest_precalign.steps.step_evidence import StepEvidence


def _evidence_seconds(run: Run, evidence: StepEvidence, step: int) -> float:
    """One recorded step; the CPU seconds spent in the evidence's calls."""
    spent = 0.0

    def timed(call: object, *args: object, **kwargs: object) -> object:
        nonlocal spent
        start = time.process_time()
        out = call(*args, **kwargs)  # type: ignore[operator]
        spent += time.process_time() - start
        return out

    run.optimizer.zero_grad(set_to_none=True)
    timed(evidence.begin)
    for part in run.batch():
        (run.model(**part).loss / 2).backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in run.params if p.grad is not None], 2.0)
    timed(evidence.grads_before_clip, norm=float(norm))
    torch.nn.utils.clip_grads_with_norm_(run.params, 1.0, norm)
    timed(evidence.grads_after_clip)
    run.optimizer.step()
    run.scheduler.step()
    timed(evidence.finish, step)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    run = Run(SIZES[args.size])
    evidence = StepEvidence(run.params)
    bare, spent = [], []
    for r in range(args.rounds + 1):
        start = time.process_time()
        run.step(run.batch(), None)
        step_seconds = time.process_time() - start
        _evidence_seconds(run, evidence, 3 * r + 1)  # untimed: the next recorded step follows
        evidence_seconds = _evidence_seconds(run, evidence, 3 * r + 2)  # a recorded one
        if r:
            bare.append(step_seconds)
            spent.append(evidence_seconds)
    result = {
        "size": args.size,
        "rounds": args.rounds,
        "bare_cpu_s": statistics.median(bare),
        "evidence_cpu_s": statistics.median(spent),
        "evidence_over_bare": statistics.median(spent) / statistics.median(bare),
        **run_facts(load_start, os.getloadavg()[0]),
    }
    print(
        f"bare step {result['bare_cpu_s'] * 1e3:.0f} ms CPU; StepEvidence {result['evidence_cpu_s'] * 1e3:.1f} ms"
        f" CPU per step ({result['evidence_over_bare']:.3f} of the bare step)"
    )
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
