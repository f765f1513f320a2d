"""Real per-rank traces laid out as a distributed run writes them (``step<N>/rank<R>/`` with a
``parallel`` manifest), for the merge tests and the benchmark.

TP ranks come from the tensor-parallel path (``run_tensor_parallel_ranks``: megatron-core
GPTModel ranks spawned on gloo, each recording its shard); pipeline stages are made by
splitting a recorded model's layers into stage traces with local layer numbers and
``layer_offsets``, which is how a PP run's stages name them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_precalign.parallel.layout import ParallelLayout
from pytest_precalign.trace.native_io import write_trace
from pytest_precalign.trace.records import Record, Trace

_LAYER = re.compile(r"^decoder\.layers\.(\d+)(?=\.|$)")
FIRST_STAGE = ("embedding",)
LAST_STAGE = ("decoder.final_layernorm", "output_layer", "logits", "loss")


def stage_of(name: str, layers: int, pp: int) -> int | None:
    """The stage a record belongs to; None for containers every stage has (``decoder``)."""
    m = _LAYER.match(name)
    if m:
        return int(m.group(1)) // (layers // pp)
    if name.startswith(FIRST_STAGE):
        return 0
    if name.startswith(LAST_STAGE):
        return pp - 1
    return None


def _local(name: str, offset: int) -> str:
    m = _LAYER.match(name)
    return f"decoder.layers.{int(m.group(1)) - offset}{name[m.end() :]}" if m else name


def _local_id(record_id: str, offset: int) -> str:
    name, sep, rest = record_id.partition("|")
    return f"{_local(name, offset)}{sep}{rest}"


def split_stages(trace: Trace, layers: int, pp: int) -> list[Trace]:
    """A one-stage trace -> ``pp`` stage traces with local layer numbers (containers such as
    ``decoder`` are on every stage, as in a PP run)."""
    out = []
    per = layers // pp
    for stage in range(pp):
        offset = stage * per
        records: list[Record] = []
        for rec in trace.records:
            where = stage_of(rec.name, layers, pp)
            if where is None or where == stage:
                deps = tuple(_local_id(d, offset) for d in rec.deps)
                records.append(replace(rec, name=_local(rec.name, offset), deps=deps, seq=len(records)))
        keys = {r.tensor_key for r in records if r.tensor_key is not None}
        tensors = {k: v for k, v in trace.tensors.items() if k in keys}
        out.append(Trace(dict(trace.manifest), tuple(records), tensors, trace.run))
    return out


def parallel_block(layout: ParallelLayout, rank: int, offset: int) -> dict[str, Any]:
    c = layout.coords(rank)
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "dp": layout.dp,
        "cp": 1,
        "ep": 1,
        "vpp": None,
        "world_size": layout.world_size,
        "rank": rank,
        **{f"{d}_rank": c[d] for d in ("tp", "pp", "dp", "cp", "ep")},
        "order": layout.order,
        "source": "megatron" if layout.world_size > 1 else "single",
        "sequence_parallel": False,
        "chunks": [{"index": 0, "prefix": "", "layer_offsets": {"decoder.layers": offset}}],
        "sharding": {},
    }


def write_run(
    root: Path,
    tp_traces: Sequence[Trace],
    layers: int,
    pp: int,
    dp: int = 1,
    step: int = 0,
    edit: Mapping[int, Any] | None = None,
) -> ParallelLayout:
    """``root/step<step>/rank<R>/`` for TP = len(tp_traces), ``pp`` stages, ``dp`` replicas
    (copies); ``edit[rank](block)`` may change a rank's parallel block (error tests)."""
    layout = ParallelLayout(tp=len(tp_traces), pp=pp, dp=dp)
    stages = [split_stages(t, layers, pp) for t in tp_traces]  # [tp][pp]
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        trace = stages[c["tp"]][c["pp"]]
        block = parallel_block(layout, rank, c["pp"] * (layers // pp))
        if edit and rank in edit:
            edit[rank](block)
        manifest = {**trace.manifest, "parallel": block}
        write_trace(replace(trace, manifest=manifest), root / f"step{step}" / f"rank{rank}")
    return layout


CONFIG = """
version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  megatron: {source: megatron, preset: qwen2.5, config: &qwen {vocab_size: 1000, hidden_size: 64,
             intermediate_size: 128, num_hidden_layers: LAYERS, num_attention_heads: 4,
             num_key_value_heads: 2, rms_norm_eps: 1.0e-6, rope_theta: 1000000.0,
             max_position_embeddings: 128, tie_word_embeddings: false}}
  megatron_tp2: {source: megatron, preset: qwen2.5, tensor_parallel: 2, config: *qwen}
inputs:
  tokens: {kind: tokens, batch: 2, seq_len: 16, vocab_size: 1000, seed: 1, labels: true}
cases:
  - {name: tp2, baseline: megatron, candidate: megatron_tp2, inputs: tokens,
     phases: [forward, backward], record: {mode: MODE}}
"""


def record_megatron(folder: Path, layers: int = 2, mode: str = "tensor") -> tuple[Trace, list[Trace]]:
    """A TP=1 megatron-core GPTModel's trace and the TP=2 ranks' traces of the same weights
    and inputs (forward and backward; in-memory tensors)."""
    from pytest_precalign.config.loader import load_config
    from pytest_precalign.recording.determinism import deterministic
    from pytest_precalign.run.launch import launch_ranks
    from pytest_precalign.run.side import run_side
    from pytest_precalign.sources import build_model, runtime
    from pytest_precalign.sources.inputs import build_inputs
    from pytest_precalign.trace.native_io import read_trace

    text = CONFIG.replace("LAYERS", str(layers)).replace("MODE", "tensor")
    path = folder / "align.yaml"
    path.write_text(text, encoding="utf-8")
    config = load_config(text, path)
    case = config.case("tp2")
    inputs = build_inputs(config.inputs["tokens"], config.base_dir)
    with deterministic(True):
        with runtime(config.models["megatron"]):
            model = build_model(config.models["megatron"], config.base_dir)
            full = {n: p.detach().clone() for n, p in model.module.named_parameters()}
            tp1 = run_side(model, inputs, case, {"side": "tp1"}, 0)
        work = folder / "launched"
        work.mkdir(exist_ok=True)
        root = launch_ranks(config.models["megatron_tp2"], config.base_dir, case, inputs, full, 0, work)
    # The ranks' own folders (torchrun, the public Recorder), read back as traces.
    folders = sorted((root / "step0").glob("rank*"), key=lambda p: int(p.name.removeprefix("rank")))
    ranks = [read_trace(p) for p in folders]
    if mode == "stats":
        tp1, ranks = _stats_only(tp1), [_stats_only(r) for r in ranks]
    return tp1, ranks


def _stats_only(trace: Trace) -> Trace:
    records = tuple(replace(r, tensor_key=None) for r in trace.records)
    return Trace({**trace.manifest, "record_mode": "stats"}, records, {}, trace.run)
