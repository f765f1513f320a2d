"""Recording compiled runs on the user's paths, with inductor (slow: inductor compiles for
minutes on 2 cores): a tiny Qwen2 recorded in stats mode keeps its graph whole and its numbers
bitwise; a ``transformers.Trainer`` run with ``torch_compile=True`` recorded by
``PrecalignCallback`` (``aot_eager``: the callback's wiring, not inductor's kernels) compiles
the graphs it compiles without it (one more variant: the recorded one) and trains the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from pytest_precalign.recording import HookRecorder
from tests.helpers.tiny_lm import tiny_causal_lm

HERE = Path(__file__).parent
REPO = HERE.parents[1]

pytestmark = pytest.mark.slow


def _step(
    model: torch.nn.Module, run: torch.nn.Module, ids: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = run(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _counts() -> tuple[int, int]:
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


# dynamo, tracing the model, touches .grad of non-leaf tensors and warns (torch's, not ours)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
# inductor's own import of torch.utils.mkldnn (torch's deprecation, not ours)
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductor_qwen2_recorded_in_stats_mode_is_one_graph_and_bitwise() -> None:
    torch._dynamo.reset()
    counters.clear()
    model = tiny_causal_lm()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    run = torch.compile(model)  # inductor
    with HookRecorder(run, mode="stats") as rec:
        recorded = _step(model, run, ids)
    assert _counts() == (1, 0)
    bare = _step(model, run, ids)
    assert _counts() == (2, 0)  # the variant without statistics, one whole graph too
    assert torch.equal(recorded[0], bare[0])
    assert all(torch.equal(recorded[1][n], bare[1][n]) for n in bare[1])
    trace = rec.trace({})
    kinds = {r.kind for r in trace.records}
    assert kinds == {"input", "activation", "grad_output", "grad_input", "param_grad"}  # grads in the graph
    assert all(r.stats is not None for r in trace.records)
    assert not any("_orig_mod" in r.name for r in trace.records)


def test_trainer_torch_compile_with_the_callback_trains_the_same_and_keeps_its_graphs(tmp_path: Path) -> None:
    facts = {}
    for variant in ("bare", "callback"):
        done = subprocess.run(
            [sys.executable, str(HERE / "hf_compiled_run.py"), str(tmp_path / variant), "aot_eager", variant],
            env={**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"},
            capture_output=True,
            text=True,
            timeout=3000,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        facts[variant] = json.loads((tmp_path / variant / "facts.json").read_text(encoding="utf-8"))
    assert facts["callback"]["logged"] == facts["bare"]["logged"]
    assert (facts["bare"]["graphs"], facts["bare"]["breaks"]) == (1, 0)
    assert (facts["callback"]["graphs"], facts["callback"]["breaks"]) == (
        2,
        0,
    )  # unrecorded + recorded variant
    manifest = json.loads((tmp_path / "callback" / "run" / "step1" / "rank0" / "manifest.json").read_text())
    assert manifest["compiled"]["stats"] == "in the graph"
    index = json.loads((tmp_path / "callback" / "run" / "step1" / "rank0" / "index.json").read_text())
    assert {r["kind"] for r in index["records"]} >= {
        "input",
        "activation",
        "grad_output",
        "param_grad",
        "loss",
    }


def test_lightning_compiled_module_with_the_callback_trains_the_same_and_keeps_its_graphs(
    tmp_path: Path,
) -> None:
    facts = {}
    for variant in ("bare", "callback"):
        done = subprocess.run(
            [
                sys.executable,
                str(HERE / "lightning_compiled_run.py"),
                str(tmp_path / variant),
                "aot_eager",
                variant,
            ],
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
            capture_output=True,
            text=True,
            timeout=3000,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        facts[variant] = json.loads((tmp_path / variant / "facts.json").read_text(encoding="utf-8"))
    assert facts["callback"]["losses"] == facts["bare"]["losses"]
    # the module's own training_step breaks its graph (loss.item()); recording adds no break
    assert facts["callback"]["breaks"] == facts["bare"]["breaks"]
    folder = tmp_path / "callback" / "run" / "step1" / "rank0"
    assert json.loads((folder / "manifest.json").read_text())["compiled"]["stats"] == "in the graph"
    kinds = {r["kind"] for r in json.loads((folder / "index.json").read_text())["records"]}
    assert kinds >= {"input", "activation", "grad_output", "param_grad"}
