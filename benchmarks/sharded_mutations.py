"""Sharded-run mutations: faults seeded into a user's own data-parallel loop (DDP, FSDP2's
``fully_shard``, ZeRO-1's ``ZeroRedundancyOptimizer``) recorded with ``Recorder`` under torchrun
(2 gloo ranks, CPU), each judged by ``precalign compare`` against a one-process run of the same
global batch (and the DDP ones against a DDP rerun too); fault-free pairs across DP sizes and
sharding schemes check for false alarms (issue #45, items 2, 4 and 5).

The user script is ``example_suites/recorded_runs/sharded_loop.py`` (a tiny Qwen2, 6 steps of a
4-row global batch, stats mode, every step; its knobs plant the faults). Each run is recorded
once; every pair is judged by the CLI in this process (``recorded_runs.judge``: its exit code and
report.json's ``training`` verdict) and scored as ``recorded_runs`` scores: detected (exit 1),
right step, right class, right origin where the catalogue names one (a substring of the
verdict's origin and evidence: the module, or the rank the replicas' disagreement names), false
alarms (a fault-free pair that does not exit 0).

    python benchmarks/sharded_mutations.py --out benchmarks/results/sharded_mutations.json
    python benchmarks/sharded_mutations.py --keep /tmp/sharded          # keep the recordings
    python benchmarks/sharded_mutations.py --judge-only /tmp/sharded    # judge them again

The last line of stdout is one JSON object (``--out FILE`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from recorded_runs import REPO, SCRIPTS, judge, print_table, summary  # noqa: E402

SCRIPT = SCRIPTS / "sharded_loop.py"

# run name -> (processes, the script's knobs)
RUNS: dict[str, tuple[int, str]] = {
    "one": (1, ""),
    "ddp": (2, "wrap=ddp"),
    "ddp_rerun": (2, "wrap=ddp"),
    "zero1": (2, "wrap=zero1"),
    "fsdp2": (2, "wrap=fsdp2"),
    "ddp_grads_one_rank": (2, "wrap=ddp,scale_rank_from=2"),
    "ddp_lr": (2, "wrap=ddp,lr_from=3"),
    "ddp_local_norm": (2, "wrap=ddp,local_norm_from=2"),
    "ddp_stale_param": (2, "wrap=ddp,stale_from=3"),
    "zero1_grads_one_rank": (2, "wrap=zero1,scale_rank_from=2"),
    "zero1_lr": (2, "wrap=zero1,lr_from=3"),
    "zero1_local_norm": (2, "wrap=zero1,local_norm_from=2"),
    "zero1_stale_param": (2, "wrap=zero1,stale_from=3"),
    "fsdp2_loss_one_rank": (2, "wrap=fsdp2,loss_rank_from=2"),
    "fsdp2_lr": (2, "wrap=fsdp2,lr_from=3"),
    "fsdp2_local_norm": (2, "wrap=fsdp2,local_norm_from=2"),
    "fsdp2_stale_param": (2, "wrap=fsdp2,stale_from=3"),
    "ddp_shuffled": (2, "wrap=ddp,shuffle_from=3"),
    # tensor mode (4 steps): a joined activation's rows checked replica by replica (the rank named)
    "one_tensor": (1, "mode=tensor,total=4"),
    "ddp_tensor": (2, "wrap=ddp,mode=tensor,total=4"),
    "ddp_stale_param_tensor": (2, "wrap=ddp,stale_from=3,mode=tensor,total=4"),
    "fsdp2_stale_param_tensor": (2, "wrap=fsdp2,stale_from=3,mode=tensor,total=4"),
}
STALE = "model.layers.1.mlp.down_proj"


@dataclass(frozen=True)
class Pair:
    baseline: str
    candidate: str
    step: int | None = None  # None: fault-free
    what: str = ""
    origin: str = ""  # substrings (comma-separated) the verdict's origin or evidence must all hold

    @property
    def name(self) -> str:
        return f"{self.candidate} vs {self.baseline}"

    @property
    def variant(self) -> str:
        return self.candidate.split("_")[0]


def pairs() -> list[Pair]:
    out = [
        Pair("one", "ddp"),
        Pair("one", "zero1"),
        Pair("one", "fsdp2"),
        Pair("ddp", "fsdp2"),
        Pair("ddp", "ddp_rerun"),
        Pair("one_tensor", "ddp_tensor"),
    ]
    for wrap in ("ddp", "zero1"):
        out.append(Pair("one", f"{wrap}_grads_one_rank", 2, "backward"))
    # The last rank backpropagates twice the loss it computed and records: every forward record
    # and the loss value match, the first grad of the backward (w.r.t. lm_head's output, made by
    # the loss code) does not -- the loss differs in its gradient, the class a loss whose value
    # coincides and whose gradient does not is (no module's own backward is wrong).
    out.append(Pair("one", "fsdp2_loss_one_rank", 2, "loss"))
    for wrap in ("ddp", "zero1", "fsdp2"):
        out += [
            Pair("one", f"{wrap}_lr", 3, "schedule"),
            Pair("one", f"{wrap}_local_norm", 2, "clipping", "rank1"),
            Pair("one", f"{wrap}_stale_param", 3, "forward", STALE),
        ]
    # Each rank's sampler seeded by its rank from step 3: other rows than the global batch's,
    # told by the replicas' rows joined (rows_hash) against one process, by their batch hashes
    # against a DDP rerun.
    out.append(Pair("one", "ddp_shuffled", 3, "data", "rows"))
    out.append(Pair("ddp", "ddp_shuffled", 3, "data", "batch"))
    # Against a rerun of the same DDP job: the rank is named (its partial grads, slot dp1).
    out.append(Pair("ddp", "ddp_grads_one_rank", 2, "grad_reduction", "dp1"))
    # The stale parameter's rank: from each replica's statistics against a run split the same
    # way, or from the tensors' rows against the one-process run (``verdict.dp_rows``).
    for wrap in ("ddp", "zero1", "fsdp2"):
        out.append(Pair(wrap, f"{wrap}_stale_param", 3, "forward", f"{STALE},rank1"))
    for wrap in ("ddp", "fsdp2"):
        out.append(Pair("one_tensor", f"{wrap}_stale_param_tensor", 3, "forward", f"{STALE},rank1"))
    return out


def record(out: Path, names: list[str]) -> float:
    """Record ``names`` (one process, or one torchrun of 2 ranks for all the others)."""
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}
    for nproc in (1, 2):
        specs = [f"{n}:{RUNS[n][1]}" if RUNS[n][1] else n for n in names if RUNS[n][0] == nproc]
        if not specs:
            continue
        launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run"]
        if nproc > 1:
            launch += ["--standalone", f"--nproc_per_node={nproc}"]
        done = subprocess.run(
            [*launch, str(SCRIPT), str(out), *specs], env=env, capture_output=True, text=True, cwd=SCRIPTS
        )
        if done.returncode != 0:
            raise SystemExit(f"sharded_mutations.py: {SCRIPT.name} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def told(report: Path) -> str:
    """What the verdict says names the origin: the run verdict's origin and evidence, and the
    first divergent record of each phase (its name and slot: ``dp1`` is DP replica 1's)."""
    file = report / "report.json"
    if not file.is_file():
        return ""
    data = json.loads(file.read_text(encoding="utf-8"))
    training = data.get("training") or {}
    parts = [str(training.get("origin")), str(training.get("evidence"))]
    for case in data.get("cases", ()):
        first = case.get("first_divergence") or {}
        parts.append(f"{first.get('name')} {first.get('slot')}")
    return " ".join(parts)


def score(pair: Pair, judged: dict[str, Any], report: Path) -> dict[str, Any]:
    step, what, origin = judged["found"]
    expected = None if pair.step is None else [pair.step, pair.what, pair.origin]
    row: dict[str, Any] = {"variant": pair.variant, "name": pair.name, "expected": expected, **judged}
    if expected is None:
        row["false_alarm"] = judged["exit"] != 0
        return row
    row["detected"] = judged["exit"] == 1
    row["right_step"] = step == pair.step
    row["right_class"] = what == pair.what
    if pair.origin:
        row["told"] = told(report)
        row["right_origin"] = all(part in row["told"] for part in pair.origin.split(","))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="record into this folder and keep it")
    parser.add_argument("--judge-only", type=Path, help="judge the recordings kept in this folder")
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.judge_only or args.keep or Path(scratch)
        seconds = 0.0
        if args.judge_only is None:
            root.mkdir(parents=True, exist_ok=True)
            seconds = record(root, [n for n in RUNS if not (root / n).exists()])
        rows = []
        for pair in pairs():
            report = root / "reports" / pair.name.replace(" ", "_")
            rows.append(score(pair, judge(root / pair.baseline, root / pair.candidate, report), report))
            print(f"{pair.name}: expected {rows[-1]['expected']}, found {rows[-1]['found']}", flush=True)
    figures = {
        **summary(rows),
        "record_seconds": round(seconds, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print()
    print_table(rows)
    line = json.dumps({**figures, "rows": rows})
    if args.out is not None:
        args.out.write_text(line + "\n", encoding="utf-8")
    print(
        f"\ndetected {figures['detected']}/{figures['mutations']}, right step {figures['right_step']}, right "
        f"class {figures['right_class']}, right origin {figures['right_origin']}/{figures['with_origin']}, "
        f"false alarms {figures['false_alarms']}/{figures['clean_pairs']}; {figures['seconds']} s"
    )
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
