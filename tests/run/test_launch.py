"""Launched sides (#13): ``launch: {nproc: N}``, ``pipeline_parallel`` and real ranks under
torchrun (gloo on CPU), merged to the TP=1 trace.

Config checks and the merge of pipeline stages are fast; the timeout test starts a real
torchrun and kills it; the end-to-end test runs a tiny Qwen2.5 (4 layers, hidden 64) at TP=2 x
PP=2 on 4 ranks against Hugging Face (forward, backward, one AdamW step).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_precalign.config.launch import launched, world_size
from pytest_precalign.config.loader import load_config
from pytest_precalign.config.specs import AlignConfig
from pytest_precalign.errors import CaseError, ConfigError
from pytest_precalign.parallel.merge import Chunk, RankTrace
from pytest_precalign.trace.records import Record, Trace
from pytest_precalign.vocabulary import as_kind

torch = pytest.importorskip("torch")

QWEN = """
    config:
      vocab_size: 1000
      hidden_size: 64
      intermediate_size: 128
      num_hidden_layers: 4
      num_attention_heads: 4
      num_key_value_heads: 2
      rms_norm_eps: 1.0e-6
      rope_theta: 1000000.0
      max_position_embeddings: 128
      tie_word_embeddings: false"""

CONFIG = f"""
version: 1
defaults: {{device: cpu, dtype: float32, seed: 0, deterministic: true}}
models:
  hf:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager{QWEN}
  mc:
    source: megatron
    preset: qwen2.5
    tensor_parallel: 2
    pipeline_parallel: 2
    launch: {{nproc: 4}}{QWEN}
inputs:
  tokens: {{kind: tokens, batch: 2, seq_len: 16, vocab_size: 1000, seed: 1, labels: true}}
tolerances:
  tp:
    - {{match: "*", phase: forward, step: 0, atol: 5.0e-6, rtol: 0, why: "RowParallel split-K sums"}}
    - {{match: "*", phase: backward, atol: 1.0e-6, rtol: 1.0e-5, why: "grads"}}
    - {{match: "*", atol: 2.0e-5, rtol: 1.0e-4, why: "after an AdamW step"}}
cases:
  - name: tp2_pp2
    baseline: hf
    candidate: mc
    inputs: tokens
    mapping: "preset:megatron-qwen2.5"
    phases: [forward, backward, step]
    steps: 1
    optimizer: {{name: adamw, lr: 1.0e-3, weight_decay: 0.01}}
    record: {{mode: tensor}}
    tolerances: tp
"""


def _load(tmp_path: Path, text: str = CONFIG) -> AlignConfig:
    return load_config(text, tmp_path / "align.yaml")


def _line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


# -- config -------------------------------------------------------------------------------------
def test_launch_and_pipeline_parallel_are_read(tmp_path: Path) -> None:
    spec = _load(tmp_path).models["mc"]
    assert spec.options["launch"] == {"nproc": 4, "timeout": 600.0}
    assert (spec.options["tensor_parallel"], spec.options["pipeline_parallel"]) == (2, 2)
    assert launched(spec.options) and world_size(spec.options) == 4


def test_tensor_parallel_without_launch_is_launched_on_that_many_ranks(tmp_path: Path) -> None:
    text = CONFIG.replace("    pipeline_parallel: 2\n    launch: {nproc: 4}\n", "")
    spec = _load(tmp_path, text).models["mc"]
    assert "launch" not in spec.options and launched(spec.options) and world_size(spec.options) == 2


@pytest.mark.parametrize(
    ("old", "new", "line_fragment", "fragments"),
    [
        (
            "launch: {nproc: 4}",
            "launch: {nproc: 2}",
            "launch:",
            ("models.mc.launch.nproc", "nproc must be 4"),
        ),
        (
            "launch: {nproc: 4}",
            "launch: {nprocs: 4}",
            "launch:",
            ("unknown key 'nprocs'", "did you mean 'nproc'"),
        ),
        ("launch: {nproc: 4}", "launch: {timeout: 5}", "launch:", ("missing required key 'nproc'",)),
        ("launch: {nproc: 4}", "launch: 4", "launch:", ("models.mc.launch", "expected a mapping")),
        ("pipeline_parallel: 2", "pipeline_parallel: 0", "pipeline_parallel:", ("must be >= 1",)),
        (
            "attn_implementation: eager",
            "attn_implementation: eager\n    launch: {nproc: 1}",
            "launch: {nproc: 1}",
            ("models.hf.launch", "unknown key 'launch'"),
        ),
    ],
)
def test_bad_launch_is_one_config_error_naming_file_line_and_key(
    tmp_path: Path, old: str, new: str, line_fragment: str, fragments: tuple[str, ...]
) -> None:
    text = CONFIG.replace(old, new, 1)
    with pytest.raises(ConfigError) as excinfo:
        _load(tmp_path, text)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"{(tmp_path / 'align.yaml').resolve()}:{_line_of(text, line_fragment)}: "), (
        message
    )
    for fragment in fragments:
        assert fragment in message, message


def test_isolation_is_refused_for_a_launched_candidate(tmp_path: Path) -> None:
    text = CONFIG.replace("    tolerances: tp\n", "    tolerances: tp\n    isolate: true\n")
    with pytest.raises(ConfigError, match="not with tensor_parallel > 1 .*pipeline_parallel"):
        _load(tmp_path, text)


# -- merging pipeline stages (the one merge of rank folders, parallel/merge.py) ----------------
def _rank(pp_rank: int, names: list[tuple[str, str]], offset: int) -> RankTrace:
    records = tuple(
        Record(
            i,
            name,
            "M",
            "backward" if kind.startswith("grad") else "forward",
            0,
            0,
            as_kind(kind),
            "out",
            "float32",
            (2,),
            tensor_key=f"t{i}",
        )  # fmt: skip
        for i, (name, kind) in enumerate(names)
    )
    tensors = {f"t{i}": torch.full((2,), float(10 * pp_rank + i)) for i in range(len(names))}
    trace = Trace({"record_mode": "tensor"}, records, tensors)
    return RankTrace(pp_rank, f"rank{pp_rank}", trace, (Chunk(0, "", {"decoder.layers": offset}),))


def test_stages_are_renumbered_ordered_and_shared_modules_kept_once() -> None:
    from pytest_precalign.parallel.layout import ParallelLayout
    from pytest_precalign.parallel.merge import globalize, merge_ranks

    assert (
        globalize("decoder.layers.1.mlp.linear_fc1", {"decoder.layers": 2})
        == "decoder.layers.3.mlp.linear_fc1"
    )
    assert globalize("decoder.layers_x.1", {"decoder.layers": 2}) == "decoder.layers_x.1"
    stage0 = [("decoder", "input"), ("decoder.layers.0", "activation"), ("decoder", "activation"),
              ("decoder.layers.0", "grad_output"), ("decoder", "grad_input")]  # fmt: skip
    stage1 = [("decoder", "input"), ("decoder.layers.0", "activation"), ("decoder", "activation"),
              ("logits", "logits"), ("decoder", "grad_output"), ("decoder.layers.0", "grad_output"),
              ("decoder", "grad_input")]  # fmt: skip
    merged = merge_ranks([_rank(0, stage0, 0), _rank(1, stage1, 1)], ParallelLayout(pp=2), where="x")
    order = [(r.name, r.kind) for r in merged.records]
    assert order == [
        ("decoder", "input"),  # the first stage's input
        ("decoder.layers.0", "activation"),
        ("decoder.layers.1", "activation"),
        ("decoder", "activation"),  # the last stage's output
        ("logits", "logits"),
        ("decoder", "grad_output"),  # backward: last stage first
        ("decoder.layers.1", "grad_output"),
        ("decoder.layers.0", "grad_output"),
        ("decoder", "grad_input"),  # the first stage's
    ]
    by_id = merged.by_id()
    assert float(merged.tensor(by_id["decoder|input|out|0|0"])[0]) == 0.0
    assert float(merged.tensor(by_id["decoder|activation|out|0|0"])[0]) == 12.0
    assert float(merged.tensor(by_id["decoder|grad_input|out|0|0"])[0]) == 4.0


# -- the launcher ----------------------------------------------------------------------------------
def test_a_timeout_kills_torchrun_and_its_ranks(tmp_path: Path) -> None:
    """A run that outlives its timeout ends as one CaseError, its whole process group killed."""
    pytest.importorskip("megatron.core")
    from pytest_precalign.run.launch import run_torchrun

    (tmp_path / "job.pkl").write_bytes(b"")  # never read: the ranks are killed while importing
    with pytest.raises(CaseError, match=r"did not finish within 2 s; torchrun and its ranks were killed"):
        run_torchrun(2, tmp_path, 2.0, "models.mc")
    pgid = int((tmp_path / "torchrun.pid").read_text())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    pytest.fail(f"processes of group {pgid} are still alive")


@pytest.fixture(scope="module")
def tp2_pp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[AlignConfig, object, float]:
    pytest.importorskip("megatron.core")
    pytest.importorskip("transformers")
    from pytest_precalign.run.case import run_case

    config = _load(tmp_path_factory.mktemp("launch"))
    started = time.perf_counter()
    run = run_case(config, config.case("tp2_pp2"))
    return config, run, time.perf_counter() - started


def test_tp2_pp2_on_four_ranks_aligns_with_hf(tp2_pp2: tuple[AlignConfig, object, float]) -> None:
    _, run, _ = tp2_pp2
    for phase, verdict in run.verdicts.items():  # type: ignore[attr-defined]
        assert verdict.passed and verdict.aligned, (phase, verdict.failures[:3])
        assert verdict.compared > (40 if phase == "step" else 100)
    cand = run.candidate  # type: ignore[attr-defined]
    merge = cand.manifest["parallel_merge"]
    assert merge["world_size"] == 4 and merge["layout"].startswith("tp=2, pp=2")
    assert "replica_mismatches" not in cand.manifest
    # Every layer of both stages, under its global HF name; its weights after the step too.
    names = {r.name for r in cand.records}
    for i in range(4):
        assert f"model.layers.{i}.mlp.down_proj" in names
        assert f"model.layers.{i}.mlp.down_proj.weight" in names


# 4 ranks of megatron-core on 2 cores (~55 s); the default suite shows the same path on 2 ranks
# (tests/run/test_tensor_parallel.py::test_a_failing_rank_surfaces_as_one_case_error).
@pytest.mark.slow
def test_a_rank_failure_names_the_rank_and_the_exception(
    tp2_pp2: tuple[AlignConfig, object, float], tmp_path: Path
) -> None:
    from pytest_precalign.run.launch import launch_ranks
    from pytest_precalign.sources.inputs import build_inputs

    config = tp2_pp2[0]
    case = replace(config.case("tp2_pp2"), phases=("forward",))
    inputs = build_inputs(config.inputs["tokens"], config.base_dir)
    full = {"decoder.final_layernorm.weight": torch.ones(64)}  # nothing else: every rank misses weights
    with pytest.raises(
        CaseError,
        match=r"\(4 ranks under torchrun\): rank [0-3] failed: CaseError: rank [0-3]: the TP=1 weights have no",
    ):
        launch_ranks(config.models["mc"], config.base_dir, case, inputs, full, 0, tmp_path, timeout=300)
