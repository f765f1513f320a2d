"""A parameter after an optimizer step: how far past the tolerance table, and how far from
what its inputs explain (docs/optimizer_step.md).

What it measures
    One case of an align config (default: the example suite's ``fp32_tp2_pp2_launched``,
    HF Qwen2.5 vs Megatron at TP=2 x PP=2 on 4 torchrun ranks, one AdamW step) run with
    ``pytest_precalign.run.case.run_case``. For every parameter record after a step:

    * ``table``: the worst element of ``|candidate - baseline| / (atol + rtol*|baseline|)``
      under the case's table (> 1: beyond the table; this is what judged the step before);
    * ``update_check``: the ``optimizer_update`` check (``run/update_check.py``): the case's
      optimizer (torch.optim) recomputing the step on each side's own parameter before the
      step, grad and state; ``|after - recomputed|`` of the side nearer its bound, and that
      bound (16 ulps).

    At the element furthest past the table, the two sides' grads (what the difference came
    from).

Output
    One line per parameter beyond the table (or the 5 nearest to it), then one JSON object:
    ``case``, ``params``, ``beyond_table``, ``worst_table`` (name, step, index, abs difference,
    allowed, ratio, both grads there), ``worst_update_check`` (name, step, |after - recomputed|, bound),
    ``step_passed``, ``first_divergence`` (name, metric) and the load average.

Reproduce (from the repository root)::

    python benchmarks/optimizer_step.py                       # the launched case, ~1 min
    python benchmarks/optimizer_step.py --case fp32_tp2      # 2 ranks
    python benchmarks/optimizer_step.py --case known_adamw_eps_bug_tp2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pytest_precalign.compare.pairs import PairResult
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.run.case import CaseRun, run_case
from pytest_precalign.trace.records import record_id
from pytest_precalign.vocabulary import OPTIMIZER_UPDATE

SUITE = Path(__file__).resolve().parent.parent / "example_suites" / "qwen2_5_megatron_vs_hf" / "align.yaml"


def table_excess(run: CaseRun, pair: PairResult) -> dict[str, Any]:
    """The element furthest past the table, as allclose sees it, and both grads there."""
    assert pair.candidate is not None and pair.tolerance is not None
    b = np.asarray(run.baseline.array(pair.record), dtype=np.float64)
    c = np.asarray(run.candidate.array(pair.candidate), dtype=np.float64)
    allowed = pair.tolerance.atol + pair.tolerance.rtol * np.abs(b)
    ratio = np.abs(c - b) / allowed
    flat = int(np.argmax(ratio))
    index = np.unravel_index(flat, b.shape)
    rec = pair.record
    grad_id = record_id(rec.name, "param_grad", "", rec.step, 0)
    grads = {}
    for side, trace in (("baseline", run.baseline), ("candidate", run.candidate)):
        grad = trace.by_id().get(grad_id)
        found = trace.array(grad) if grad is not None else None
        grads[side] = None if found is None else float(np.asarray(found, dtype=np.float64)[index])
    return {
        "name": rec.name,
        "step": rec.step,
        "index": [int(i) for i in index],
        "abs": float(np.abs(c - b)[index]),
        "allowed": float(allowed[index]),
        "ratio": float(ratio[index]),
        "grads": grads,
    }


def measure(config_path: Path, case_name: str) -> dict[str, Any]:
    config = load_config_file(config_path)
    case = next((c for c in config.cases if c.name == case_name), None)
    if case is None:
        raise SystemExit(f"{config_path}: no case {case_name!r}")
    run = run_case(config, case)
    params = [p for p in run.comparison.pairs if p.record.kind == "param" and p.evidence == "tensor"]
    rows = sorted((table_excess(run, p) for p in params), key=lambda r: -r["ratio"])
    checks = [(p, c) for p in params for c in p.checks if c.metric == OPTIMIZER_UPDATE]
    worst = max(checks, key=lambda t: t[1].value / t[1].allowed, default=None)
    shown = [r for r in rows if r["ratio"] > 1] or rows[:5]
    for r in shown:
        print(
            f"{r['name']} step {r['step']} at {tuple(r['index'])}: |c - b| = {r['abs']:.3e} "
            f"(table allows {r['allowed']:.3e}, {r['ratio']:.2f}x); grads there: "
            f"baseline {r['grads']['baseline']:.3e}, candidate {r['grads']['candidate']:.3e}"
        )
    verdict = run.verdicts["step"]
    first = verdict.first
    return {
        "case": case_name,
        "params": len(params),
        "judged_by_update_check": len(checks),
        "beyond_table": sum(r["ratio"] > 1 for r in rows),
        "worst_table": rows[0] if rows else None,
        "worst_update_check": None
        if worst is None
        else {
            "name": worst[0].record.name,
            "step": worst[0].record.step,
            "abs": worst[1].value,
            "bound": worst[1].allowed,
            "passed": worst[1].passed,
        },
        "step_passed": verdict.passed,
        "first_divergence": None
        if first is None
        else {"name": first.name, "step": first.step, "metric": first.metric},
        "loadavg": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=SUITE)
    parser.add_argument("--case", default="fp32_tp2_pp2_launched")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.config, args.case)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
