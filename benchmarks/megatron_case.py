"""Megatron case cost: a whole HF-vs-Megatron pytest-precalign case against the two bare steps.

What it measures
    Side by side, in one process, with rounds interleaved round-robin over the variants:

    * ``case_tensor`` -- ``pytest_precalign.run.case.run_case`` on a config this script writes
      to a temporary directory: baseline ``hf`` (``transformers.Qwen2ForCausalLM``,
      ``attn_implementation: eager``) vs candidate ``megatron`` (``source: megatron``,
      ``preset: qwen2.5``, the same ``config:``), ``mapping: "preset:megatron-qwen2.5"``,
      ``phases: [forward, backward]``, ``record: {mode: tensor}``, default tolerances. That
      is everything a case does: build both models (random init from the seed), sync the
      weights through the mapping, one recorded forward+backward per side (causal-LM loss),
      map the candidate's trace into the baseline's names, compare, and decide verdicts;
    * ``case_stats``  -- the same case with ``record: {mode: stats}``;
    * ``bare_hf``     -- one forward+backward of the HF model, no recorder;
    * ``bare_megatron`` -- one forward+backward of the Megatron model, no recorder, called as
      ``sources.megatron.call(module, {"input_ids": ids})`` inside
      ``sources.megatron.runtime(spec)``.

    The bare models are built once, before the rounds, with ``sources.build_model`` from the
    same config (so the same classes, eager attention, fp32), and the Megatron weights are
    synced from the HF model. The bare timed region is forward .. ``run.trainers.loop_step.causal_lm_loss``
    (the case's own loss: shifted next-token cross-entropy in fp32) .. ``loss.backward()``;
    it runs inside ``determinism.deterministic(True)`` like the case (the config's default).
    Entering and leaving Megatron's ``runtime`` (a gloo process group) is outside the bare
    timed region, and inside the case's. Grads are set to ``None`` and ``gc.collect()`` runs
    before every run, outside the timed region.

    The figure of merit is ``ratio_<mode> = case_<mode>_s / (bare_hf_s + bare_megatron_s)``
    (medians): how many bare forward+backward pairs one whole case costs.

Breakdown
    While ``run_case`` runs, the names it calls in ``pytest_precalign.run.case``
    (``build_inputs``, ``deterministic``, ``runtime``, ``build_model``, ``sync_weights``,
    ``environment``, ``run_side``, ``Recorder.trace``, ``map_trace``, ``compare_traces``,
    ``phase_verdict``, ``gc``) are replaced by thin wrappers that add a
    ``time.perf_counter()`` difference to a per-stage total (microseconds per case; ``src/``
    is not edited). Stages: ``inputs``, ``deterministic`` (enter + exit), ``runtime_enter``,
    ``build_hf``, ``build_megatron``, ``sync``, ``environment``, ``run_hf`` /
    ``run_megatron`` (recorded forward+backward, without ``trace``), ``trace_hf`` /
    ``trace_megatron`` (``Recorder.trace``: stats of every kept tensor in tensor mode),
    ``runtime_exit``, ``gc`` (the ``gc.collect()`` after the models are dropped), ``map``,
    ``compare``, ``verdicts``, ``other`` (the rest: dropping the two models, bookkeeping).
    Each stage's median is taken over the rounds on its own, so the stage medians need not
    add up to the case median. ``--profile N`` adds one cProfile'd tensor-mode case after the
    rounds and prints the top N functions by cumulative and by own time.

Sizes
    ``mid``:  vocab 32000, hidden 512, intermediate 1408, 8 layers, 8 heads, 2 KV heads,
              rms_norm_eps 1e-6, rope_theta 1e6, max_position_embeddings 512, untied;
              batch 2, seq 256.
    ``tiny``: vocab 1000, hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads,
              max_position_embeddings 128; batch 2, seq 32 (for a quick smoke test).

Output
    Per-variant median / min seconds, the ratios, the per-stage medians of each case, then,
    as the last line of stdout, one JSON object (``case_tensor_s``, ``case_stats_s``,
    ``bare_hf_s``, ``bare_megatron_s``, ``ratio_tensor``, ``ratio_stats``, ``*_min_s``,
    ``stages_tensor``, ``stages_stats``, ``records_*``, ``tensor_mib``, ``loadavg_*``, ...).

Reproduce (from the repository root)::

    . .venv/bin/activate
    python benchmarks/megatron_case.py --size mid --warmup 1 --rounds 5
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
import transformers
from _shared import SIZES, Size, run_facts, summarize

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.config.specs import AlignConfig, CaseSpec, ModelSpec
from pytest_precalign.mapping.apply import map_trace
from pytest_precalign.mapping.weights import sync_weights
from pytest_precalign.recording import HookRecorder as Recorder
from pytest_precalign.recording.determinism import deterministic, environment
from pytest_precalign.run import case as runner
from pytest_precalign.run import live, outcome, side
from pytest_precalign.run.trainers.loop_step import causal_lm_loss
from pytest_precalign.sources import LoadedModel, build_model, runtime
from pytest_precalign.sources import megatron as megatron_source
from pytest_precalign.sources.inputs import build_inputs
from pytest_precalign.trace.records import Trace
from pytest_precalign.verdict.phase import phase_verdict

VARIANTS: tuple[str, ...] = ("case_tensor", "case_stats", "bare_hf", "bare_megatron")
MODES: tuple[str, ...] = ("tensor", "stats")
STAGES: tuple[str, ...] = (
    "inputs",
    "deterministic",
    "runtime_enter",
    "build_hf",
    "build_megatron",
    "sync",
    "environment",
    "run_hf",
    "trace_hf",
    "run_megatron",
    "trace_megatron",
    "runtime_exit",
    "gc",
    "map",
    "compare",
    "verdicts",
    "other",
)


@dataclass
class RunResult:
    seconds: float
    stages: dict[str, float] = field(default_factory=dict)
    records: int | None = None
    tensor_bytes: int | None = None
    passed: bool | None = None


def config_text(size: Size) -> str:
    """The alignment YAML: one tensor-mode and one stats-mode case, HF baseline, Megatron candidate."""
    return f"""\
version: 1
defaults: {{device: cpu, dtype: float32, seed: 0, deterministic: true}}
models:
  hf:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: &qwen25
      vocab_size: {size.vocab}
      hidden_size: {size.hidden}
      intermediate_size: {size.intermediate}
      num_hidden_layers: {size.layers}
      num_attention_heads: {size.heads}
      num_key_value_heads: {size.kv_heads}
      rms_norm_eps: 1.0e-6
      rope_theta: 1000000.0
      max_position_embeddings: {size.max_positions}
      tie_word_embeddings: false
  megatron:
    source: megatron
    preset: qwen2.5
    config: *qwen25
inputs:
  tokens: {{kind: tokens, batch: {size.batch}, seq_len: {size.seq}, vocab_size: {size.vocab}, seed: 1, labels: true}}
cases:
  - name: case_tensor
    baseline: hf
    candidate: megatron
    inputs: tokens
    mapping: "preset:megatron-qwen2.5"
    phases: [forward, backward]
    record: {{mode: tensor}}
  - name: case_stats
    baseline: hf
    candidate: megatron
    inputs: tokens
    mapping: "preset:megatron-qwen2.5"
    phases: [forward, backward]
    record: {{mode: stats}}
"""


class StageTimer:
    """Per-stage totals for one ``run_case``, fed by wrappers patched into ``runner``."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.side = "hf"

    def add(self, stage: str, seconds: float) -> None:
        self.totals[stage] += seconds

    def wrap(self, stage: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            name = stage(*args, **kwargs) if callable(stage) else stage
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - start)

        return timed

    @contextmanager
    def timed_deterministic(self, enabled: bool) -> Iterator[dict[str, Any]]:
        start = time.perf_counter()
        with deterministic(enabled) as flags:
            self.add("deterministic", time.perf_counter() - start)
            yield flags
            start = time.perf_counter()
        self.add("deterministic", time.perf_counter() - start)

    @contextmanager
    def timed_runtime(self, spec: ModelSpec) -> Iterator[None]:
        start = time.perf_counter()
        with runtime(spec):
            self.add("runtime_enter", time.perf_counter() - start)
            yield
            start = time.perf_counter()
        self.add("runtime_exit", time.perf_counter() - start)

    @contextmanager
    def installed(self) -> Iterator[None]:
        timer = self
        original_run_side = live.run_side

        class TimedRecorder(Recorder):
            def trace(self, manifest: Mapping[str, Any] | None = None) -> Trace:
                start = time.perf_counter()
                try:
                    return super().trace(manifest)
                finally:
                    timer.add(f"trace_{timer.side}", time.perf_counter() - start)

        def run_side(model: LoadedModel, *args: Any, **kwargs: Any) -> Trace:
            timer.side = model.name
            start = time.perf_counter()
            trace_before = timer.totals[f"trace_{model.name}"]
            try:
                return original_run_side(model, *args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                timer.add(f"run_{model.name}", spent - (timer.totals[f"trace_{model.name}"] - trace_before))

        gc_shim = SimpleNamespace(collect=self.wrap("gc", gc.collect))
        patches: list[AbstractContextManager[Any]] = [
            mock.patch.object(live, "build_inputs", self.wrap("inputs", build_inputs)),
            mock.patch.object(live, "runtime", self.timed_runtime),
            mock.patch.object(live, "deterministic", self.timed_deterministic),
            mock.patch.object(outcome, "phase_verdict", self.wrap("verdicts", phase_verdict)),
            mock.patch.object(
                live, "build_model", self.wrap(lambda spec, _dir: f"build_{spec.name}", build_model)
            ),
            mock.patch.object(live, "sync_weights", self.wrap("sync", sync_weights)),
            mock.patch.object(live, "environment", self.wrap("environment", environment)),
            mock.patch.object(side, "Recorder", TimedRecorder),
            mock.patch.object(live, "run_side", run_side),
            mock.patch.object(outcome, "map_trace", self.wrap("map", map_trace)),
            mock.patch.object(outcome, "compare_traces", self.wrap("compare", compare_traces)),
        ]
        if hasattr(runner, "gc"):  # older runners collected garbage after each case
            patches.append(mock.patch.object(runner, "gc", gc_shim))
        with ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            yield


def run_case_once(config: AlignConfig, case: CaseSpec) -> RunResult:
    gc.collect()
    timer = StageTimer()
    with timer.installed():
        start = time.perf_counter()
        result = runner.run_case(config, case)
        seconds = time.perf_counter() - start
    stages = {s: timer.totals.get(s, 0.0) for s in STAGES if s != "other"}
    stages["other"] = seconds - sum(stages.values())
    traces = (result.baseline, result.candidate)
    records = sum(len(t.records) for t in traces)
    tensor_bytes = sum(
        v.numel() * v.element_size()
        for t in traces
        for v in t.tensors.values()
        if isinstance(v, torch.Tensor)
    )
    passed = all(v.passed for v in result.verdicts.values())
    del result, traces
    return RunResult(seconds, stages, records, tensor_bytes, passed)


@dataclass
class BareModels:
    hf: LoadedModel
    megatron: LoadedModel
    megatron_spec: ModelSpec
    ids: torch.Tensor


def build_bare(config: AlignConfig, size: Size) -> BareModels:
    hf_spec, mg_spec = config.models["hf"], config.models["megatron"]
    with megatron_source.runtime(mg_spec):
        hf = build_model(hf_spec, config.base_dir)
        mg = build_model(mg_spec, config.base_dir)
        mapping = config.case("case_tensor").mapping
        sync_weights(hf.module, mg.module, mapping, strict=True)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=gen)
    for m in (hf, mg):
        m.module.train(True)
    return BareModels(hf, mg, mg_spec, ids)


def bare_step(model: LoadedModel, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    output = model({"input_ids": ids})
    loss = causal_lm_loss(model.logits(output), ids)
    loss.backward()
    return time.perf_counter() - start


def run_bare_once(bare: BareModels, which: str) -> RunResult:
    model = bare.hf if which == "hf" else bare.megatron
    model.module.zero_grad(set_to_none=True)
    gc.collect()
    with deterministic(True):
        if which == "hf":
            seconds = bare_step(model, bare.ids)
        else:
            with megatron_source.runtime(bare.megatron_spec):
                seconds = bare_step(model, bare.ids)
    model.module.zero_grad(set_to_none=True)
    return RunResult(seconds)


def profile_case(config: AlignConfig, case: CaseSpec, top: int) -> str:
    profiler = cProfile.Profile()
    gc.collect()
    profiler.enable()
    runner.run_case(config, case)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="discarded warm-up rounds (default 1)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave default)")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the rounds, cProfile one tensor-mode case and print the top N functions (0: off)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0 or args.profile < 0:
        parser.error("--rounds must be >= 1, --warmup and --profile >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # megatron-core's import-time and deprecation chatter
    size = SIZES[args.size]
    with tempfile.TemporaryDirectory(prefix="precalign-bench-") as tmp:
        path = Path(tmp) / "align.yaml"
        path.write_text(config_text(size), encoding="utf-8")
        config = load_config_file(path)
        cases = {mode: config.case(f"case_{mode}") for mode in MODES}
        bare = build_bare(config, size)
        params_hf = sum(p.numel() for p in bare.hf.module.parameters())
        params_mg = sum(p.numel() for p in bare.megatron.module.parameters())
        print(
            f"Qwen2.5-style size={args.size} params hf={params_hf / 1e6:.1f}M megatron={params_mg / 1e6:.1f}M "
            f"batch={size.batch} seq={size.seq} fp32 cpu threads={torch.get_num_threads()} "
            f"torch={torch.__version__} transformers={transformers.__version__}"
        )
        load_start = os.getloadavg()[0]
        print(f"1-min load average at start: {load_start:.2f} (machine has {os.cpu_count()} CPUs)")
        print(
            f"interleaved: {args.warmup} warm-up + {args.rounds} measured rounds over {', '.join(VARIANTS)}"
        )

        results: dict[str, list[RunResult]] = {v: [] for v in VARIANTS}
        for rnd in range(args.warmup + args.rounds):
            measured = rnd >= args.warmup
            line = []
            for variant in VARIANTS:
                if variant.startswith("case_"):
                    res = run_case_once(config, cases[variant.removeprefix("case_")])
                else:
                    res = run_bare_once(bare, variant.removeprefix("bare_"))
                extra = f" (compare {res.stages['compare']:.2f}s)" if variant == "case_tensor" else ""
                line.append(f"{variant}={res.seconds:.3f}s{extra}")
                if measured:
                    results[variant].append(res)
            label = f"round {rnd - args.warmup + 1}" if measured else f"warm-up {rnd + 1}"
            print(f"  {label:<10} " + "  ".join(line), flush=True)
        load_end = os.getloadavg()[0]

        profile_text = profile_case(config, cases["tensor"], args.profile) if args.profile else ""
        del bare
        gc.collect()

    summary: dict[str, tuple[float, float]] = {
        v: summarize([r.seconds for r in results[v]]) for v in VARIANTS
    }
    bare_sum = summary["bare_hf"][0] + summary["bare_megatron"][0]
    bare_sum_min = summary["bare_hf"][1] + summary["bare_megatron"][1]
    print(f"\n{'variant':<14} {'median s':>9} {'min s':>9} {'/ bare pair':>12}")
    for variant in VARIANTS:
        median, minimum = summary[variant]
        print(f"{variant:<14} {median:>9.4f} {minimum:>9.4f} {median / bare_sum:>11.2f}x")
    print(f"{'bare pair':<14} {bare_sum:>9.4f} {bare_sum_min:>9.4f} {1.0:>11.2f}x")

    stage_medians: dict[str, dict[str, float]] = {}
    for mode in MODES:
        runs = results[f"case_{mode}"]
        stage_medians[mode] = {s: statistics.median(r.stages[s] for r in runs) for s in STAGES}
    print(f"\n{'stage (median s)':<16} " + " ".join(f"{m:>9}" for m in MODES))
    for stage in STAGES:
        print(f"{stage:<16} " + " ".join(f"{stage_medians[m][stage]:>9.4f}" for m in MODES))
    groups = {
        "build+sync": ("runtime_enter", "build_hf", "build_megatron", "sync", "runtime_exit"),
        "run (fwd+bwd)": ("run_hf", "run_megatron"),
        "trace": ("trace_hf", "trace_megatron"),
        "map+compare": ("map", "compare"),
    }
    for group, members in groups.items():
        print(
            f"{'= ' + group:<16} "
            + " ".join(f"{sum(stage_medians[m][s] for s in members):>9.4f}" for m in MODES)
        )

    last_tensor = results["case_tensor"][-1]
    last_stats = results["case_stats"][-1]
    tensor_mb = (last_tensor.tensor_bytes or 0) / 2**20
    print(
        f"\nrecords per case (both sides): tensor {last_tensor.records}, stats {last_stats.records}; "
        f"tensor mode keeps {tensor_mb:.1f} MiB; verdicts passed: "
        f"tensor {last_tensor.passed}, stats {last_stats.passed}"
    )
    print(
        f"1-min load average: {load_start:.2f} at start, {load_end:.2f} at end (machine has {os.cpu_count()} CPUs)"
    )
    if profile_text:
        print(f"\ncProfile of one tensor-mode case (top {args.profile}):")
        print(profile_text)

    payload: dict[str, Any] = {
        "case_tensor_s": round(summary["case_tensor"][0], 4),
        "case_stats_s": round(summary["case_stats"][0], 4),
        "bare_hf_s": round(summary["bare_hf"][0], 4),
        "bare_megatron_s": round(summary["bare_megatron"][0], 4),
        "ratio_tensor": round(summary["case_tensor"][0] / bare_sum, 3),
        "ratio_stats": round(summary["case_stats"][0] / bare_sum, 3),
        "case_tensor_min_s": round(summary["case_tensor"][1], 4),
        "case_stats_min_s": round(summary["case_stats"][1], 4),
        "bare_hf_min_s": round(summary["bare_hf"][1], 4),
        "bare_megatron_min_s": round(summary["bare_megatron"][1], 4),
        "ratio_tensor_min": round(summary["case_tensor"][1] / bare_sum_min, 3),
        "ratio_stats_min": round(summary["case_stats"][1] / bare_sum_min, 3),
        "stages_tensor": {s: round(v, 4) for s, v in stage_medians["tensor"].items()},
        "stages_stats": {s: round(v, 4) for s, v in stage_medians["stats"].items()},
        "records_tensor": last_tensor.records,
        "records_stats": last_stats.records,
        "tensor_mib": round(tensor_mb, 1),
        "passed_tensor": last_tensor.passed,
        "passed_stats": last_stats.passed,
        "size": args.size,
        "rounds": args.rounds,
        "warmup": args.warmup,
        **run_facts(load_start, load_end),
    }
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
