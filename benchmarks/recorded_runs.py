"""Recorded-run variants of the training mutations: a user's own runs, recorded the ways users
record them, judged by ``precalign compare`` as CI would (issue #32's acceptance).

Each fault is planted by a knob of a real user script (``example_suites/recorded_runs/``): a
``transformers.Trainer`` fine-tune recorded by ``PrecalignCallback`` and a hand-written torch
loop recorded by ``Recorder``. Each variant records its baseline, its faulty runs and its
fault-free pairs in one process, then judges every run against the baseline with the CLI
(``precalign compare BASE RUN --report DIR``) and reads report.json's ``training`` object:

- ``callback_scalars``: ``PrecalignCallback(root)`` (mode scalars, the default), every step;
- ``callback_steps``: ``PrecalignCallback(root, mode="stats", steps=[3, 5])``;
- ``recorder_scalars``: ``Recorder(root, mode="scalars")`` in the loop;
- ``recorder_msprobe``: ``Recorder(root, mode="stats", steps=[3, 5], format="msprobe")``.

A fault counts as detected when compare exits 1; right step / right class when the run
verdict's ``first_divergent_step`` / ``first_divergent`` are the catalogue's; a fault-free
pair that does not exit 0 is a false alarm; ``refused`` counts the pairs compare rejected as
bad input (exit 2). Steps are 0-based optimizer steps.

    python benchmarks/mutations.py --training --recorded
    python benchmarks/recorded_runs.py --variant callback_scalars --keep /tmp/rec
    python benchmarks/recorded_runs.py --judge-only /tmp/rec    # judge kept recordings again

The last line of stdout is one JSON object; ``--out FILE`` writes it too
(``benchmarks/results/training_recorded_runs.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
REPO = HERE.parent
SCRIPTS = REPO / "example_suites" / "recorded_runs"
sys.path.insert(0, str(REPO / "src"))  # this checkout's package, as the recording scripts get it
LAYER_STEPS = (3, 5)  # the steps whose layers the *_steps / *_msprobe variants record


@dataclass(frozen=True)
class Variant:
    script: str
    record: str  # the recording knobs every run of the variant gets
    layers: bool  # layers recorded on LAYER_STEPS


VARIANTS = {
    "callback_scalars": Variant("trainer_finetune.py", "", False),
    "callback_steps": Variant("trainer_finetune.py", "mode=stats,steps=3+5", True),
    "recorder_scalars": Variant("torch_loop.py", "", False),
    "recorder_msprobe": Variant("torch_loop.py", "mode=stats,steps=3+5,format=msprobe", True),
}


@dataclass(frozen=True)
class Mutation:
    name: str
    knobs: str
    step: int | None = None  # None: a fault-free pair
    what: str = ""  # the class in a run without layers at that step
    layer: str = ""  # the module a layer fault is in: "forward" with that origin when its step is recorded

    def expected(self, variant: Variant) -> tuple[int, str, str] | None:
        if self.step is None:
            return None
        if self.layer and variant.layers and self.step in LAYER_STEPS:
            return self.step, "forward", self.layer
        return self.step, self.what, ""


MLP, ATTN = "model.layers.1.mlp", "model.layers.0.self_attn"
# Faults any user script here can plant (its own knobs).
COMMON = [
    Mutation("clip_from_step_3", "clip_from=3", 3, "clipping"),
    Mutation("clip_from_step_6", "clip_from=6", 6, "clipping"),
    Mutation("data_order_from_step_3", "shuffle_from=3", 3, "data"),
    Mutation("data_order_from_step_6", "shuffle_from=6", 6, "data"),
    Mutation("mlp_bug_from_step_5", "layer_bug_from=5", 5, "loss", MLP),
    Mutation("mlp_bug_from_step_3", "layer_bug_from=3", 3, "loss", MLP),
]
TRAINER = [
    # settings in TrainingArguments: in the plan, caught before step 0 at the first planned step that differs
    Mutation("scheduler_linear_not_cosine", "scheduler=linear", 3, "settings"),
    Mutation("peak_lr_other", "lr=6e-3", 1, "settings"),
    Mutation("warmup_longer", "warmup=3", 1, "settings"),
    Mutation("weight_decay_other", "weight_decay=0.05", 0, "settings"),
    *COMMON,
    Mutation("attn_bug_from_step_3", "attn_bug_from=3", 3, "loss", ATTN),
    Mutation("attn_bug_from_step_7", "attn_bug_from=7", 7, "loss", ATTN),
    Mutation("lr_bumped_from_step_4", "lr_bump_from=4", 4, "schedule"),
    Mutation("clean_rerun", ""),
    Mutation("clean_eager_vs_sdpa", "attn=sdpa"),
    Mutation("clean_micro_batches_4x1", "micro=4x1"),
]
LOOP = [
    # the loop writes no plan: another peak LR is found in the run (step 0 has LR 0)
    Mutation("peak_lr_other", "lr=6e-3", 1, "schedule"),
    *COMMON,
    Mutation("clean_rerun", ""),
]
CATALOGUE = {"trainer_finetune.py": TRAINER, "torch_loop.py": LOOP}


def _spec(name: str, *knobs: str) -> str:
    given = ",".join(k for k in knobs if k)
    return f"{name}:{given}" if given else name


def record(variant: Variant, out: Path, mutations: list[Mutation]) -> float:
    """Record the variant's baseline and ``mutations`` in one process; the seconds it took."""
    started = time.perf_counter()
    runs = [_spec("baseline", variant.record), *(_spec(m.name, variant.record, m.knobs) for m in mutations)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / variant.script), str(out), *runs],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"recorded_runs.py: {variant.script} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def judge(base: Path, cand: Path, report: Path) -> dict[str, Any]:
    """``precalign compare BASE CAND --report REPORT`` (the CLI's ``main``, in this process):
    its exit code and the run verdict of report.json; a crash is exit ``"crash"``."""
    from pytest_precalign.cli import main as precalign

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code: int | str = precalign(["compare", str(base), str(cand), "--report", str(report)])
    except Exception as exc:  # a traceback is a finding of the benchmark, not its end
        code = "crash"
        out.write(f"{type(exc).__name__}: {exc}")
    file = report / "report.json"
    training = json.loads(file.read_text()).get("training") if file.is_file() else None
    training = training if isinstance(training, dict) else {}
    said = out.getvalue().strip().splitlines()
    return {
        "exit": code,
        "found": [
            training.get("first_divergent_step"),
            training.get("first_divergent"),
            training.get("origin"),
        ],
        "said": next((line.strip()[:300] for line in said if "diverged first" in line or "rror" in line), ""),
    }


def step_scalars(root: Path) -> dict[int, dict[str, Any]]:
    """Each step's scalars as the native manifests of a recording hold them (rank 0)."""
    out: dict[int, dict[str, Any]] = {}
    for manifest in root.glob("step*/rank0/manifest.json"):
        out.update({int(k): v for k, v in json.loads(manifest.read_text()).get("scalars", {}).items()})
    return out


def spread(base: Path, cand: Path) -> dict[str, float] | None:
    """A fault-free pair's largest |difference| over the steps of each float scalar (what a
    tolerance table must allow), from the recordings themselves; None without scalars."""
    one, two = step_scalars(base), step_scalars(cand)
    if not one or set(one) != set(two):
        return None
    keys = ("loss", "grad_norm", "clip_coef", "update_norm", "param_norm")
    return {
        k: max(abs(one[s][k] - two[s][k]) for s in one)
        for k in keys
        if all(isinstance(one[s].get(k), float) and isinstance(two[s].get(k), float) for s in one)
    }


# A step's scalars in the order the step makes them; floats within torch.testing's fp32 default
# (atol 1e-5, rtol 1.3e-6), LRs and weight decays to a relative 1e-6, the rest exactly.
STEP_ORDER = ("batch_hash", "tokens", "loss", "grad_norm", "clip_coef", "lr", "weight_decay", "update_norm")


def _differ(key: str, a: Any, b: Any) -> bool:
    if key in ("lr", "weight_decay") and isinstance(a, list) and isinstance(b, list):
        return len(a) != len(b) or any(abs(x - y) > 1e-6 * abs(x) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) > 1e-5 + 1.3e-6 * abs(b)
    return bool(a != b)


def first_scalar_difference(base: Path, cand: Path) -> list[Any] | None:
    """[step, scalar] of the first recorded scalar that differs, read from the recordings alone
    (the catalogue's check, independent of the verdict); None when none does."""
    one, two = step_scalars(base), step_scalars(cand)
    for step in sorted(one):
        for key in STEP_ORDER:
            if _differ(key, one[step].get(key), two.get(step, {}).get(key)):
                return [step, key]
    return None


def score(variant_name: str, m: Mutation, judged: dict[str, Any]) -> dict[str, Any]:
    expected = m.expected(VARIANTS[variant_name])
    step, what, origin = judged["found"]
    row: dict[str, Any] = {
        "variant": variant_name,
        "name": m.name,
        "expected": None if expected is None else list(expected),
        **judged,
    }
    if expected is None:
        row["false_alarm"] = judged["exit"] != 0
        return row
    row["detected"] = judged["exit"] == 1
    row["right_step"] = step == expected[0]
    row["right_class"] = what == expected[1]
    if expected[2]:
        row["right_origin"] = origin == expected[2]
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    faults = [r for r in rows if r["expected"] is not None]
    clean = [r for r in rows if r["expected"] is None]
    origins = [r for r in faults if "right_origin" in r]
    return {
        "mutations": len(faults),
        "clean_pairs": len(clean),
        "detected": sum(r["detected"] for r in faults),
        "right_step": sum(r["detected"] and r["right_step"] for r in faults),
        "right_class": sum(r["detected"] and r["right_step"] and r["right_class"] for r in faults),
        "with_origin": len(origins),
        "right_origin": sum(r["right_origin"] for r in origins),
        "false_alarms": sum(r["false_alarm"] for r in clean),
        "refused": sum(r["exit"] == 2 for r in rows),
        "crashed": sum(r["exit"] == "crash" for r in rows),
    }


def _shown(found: list[Any] | None) -> str:
    return (
        "-" if not found or found[0] is None and found[1] is None else ", ".join(str(v) for v in found if v)
    )


def print_table(rows: list[dict[str, Any]]) -> None:
    """One markdown row per judged pair (benchmarks/results/detection_rates.md)."""
    print("| variant | run | expected (step, class, origin) | exit | found (step, class, origin) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['name']} | {_shown(r['expected'])} | {r['exit']} | {_shown(r['found'])} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant", action="append", choices=sorted(VARIANTS), help="repeatable; default all"
    )
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument("--keep", help="record into this directory (kept)")
    parser.add_argument("--judge-only", help="judge the recordings a --keep run left in this directory")
    parser.add_argument("--out", help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    chosen = args.variant or list(VARIANTS)
    wanted = {n.strip() for n in (args.only or "").split(",") if n.strip()}
    known = {m.name for ms in CATALOGUE.values() for m in ms}
    if wanted - known:
        parser.error(
            f"--only: unknown mutation(s) {', '.join(sorted(wanted - known))} (allowed: {', '.join(sorted(known))})"
        )
    started = time.perf_counter()
    rows, seconds = [], {}
    with tempfile.TemporaryDirectory(prefix="precalign-recorded-") as tmp:
        work = Path(args.judge_only or args.keep or tmp)
        for name in chosen:
            variant = VARIANTS[name]
            mutations = [m for m in CATALOGUE[variant.script] if not wanted or m.name in wanted]
            if not args.judge_only:
                seconds[name] = round(record(variant, work / name, mutations), 1)
            for m in mutations:
                judged = judge(
                    work / name / "baseline", work / name / m.name, work / "reports" / name / m.name
                )
                rows.append(score(name, m, judged))
                pair = (work / name / "baseline", work / name / m.name)
                rows[-1]["recorded_first"] = first_scalar_difference(*pair)
                if m.step is None:
                    rows[-1]["spread"] = spread(*pair)
                print(
                    f"{name} {m.name}: expected {rows[-1]['expected']}, exit {judged['exit']}, found {judged['found']}",
                    flush=True,
                )
    figures = {
        **summary(rows),
        "per_variant": {v: summary([r for r in rows if r["variant"] == v]) for v in chosen},
    }
    figures["seconds"] = round(time.perf_counter() - started, 1)
    figures["recording_seconds"] = seconds
    n = figures["mutations"]
    print(
        f"\ndetected {figures['detected']}/{n}, right step {figures['right_step']}/{n}, right class "
        f"{figures['right_class']}/{n}, right origin {figures['right_origin']}/{figures['with_origin']}, "
        f"false alarms {figures['false_alarms']}/{figures['clean_pairs']}, refused (exit 2) "
        f"{figures['refused']}/{len(rows)}; {figures['seconds']} s"
    )
    print_table(rows)
    document = {**figures, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
