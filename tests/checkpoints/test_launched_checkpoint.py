"""A launched Megatron side (``tensor_parallel: 2`` under torchrun) loads a checkpoint: the
parent loads it whole into the TP=1 twin and each rank loads its shard of that. For the TP=2
legacy checkpoint megatron-core wrote, each rank's shard is exactly its ``mp_rank_0R`` file;
end to end, the right conversion is aligned with the HF folder it came from and the planted
gate/up swap is the origin at its module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pytest_precalign.checkpoints.compare import load_checkpoint
from pytest_precalign.run.tensor_parallel import shard_state
from tests.helpers.checkpoints import HF_CONFIG_HEAD
from tests.helpers.runs import RunPytest

pytest.importorskip("megatron.core")


def test_each_rank_shard_of_the_loaded_checkpoint_is_its_mp_rank_file(megatron_ckpts: Path) -> None:
    folder = megatron_ckpts / "good" / "tp2"
    full = load_checkpoint(folder)  # merged, as the launched side's TP=1 twin loads it
    for rank in (0, 1):
        saved = torch.load(
            folder / "iter_0000001" / f"mp_rank_0{rank}" / "model_optim_rng.pt", weights_only=False
        )
        files = {
            k: v for k, v in saved["model"].items() if isinstance(v, torch.Tensor) and "_extra_state" not in k
        }
        shard = shard_state(full, 2, rank)
        assert sorted(shard) == sorted(files)
        assert all(torch.equal(shard[k], files[k]) for k in files), rank


CONFIG = (
    HF_CONFIG_HEAD
    + """\
  mc_tp2: {{source: megatron, config: *c, tensor_parallel: 2, launch: {{nproc: 2}},
           weights: {{load: {ck}/good/tp2, format: megatron}}}}
  mc_fc1: {{source: megatron, config: *c, tensor_parallel: 2, weights: {{load: {ck}/bad_fc1/tp2, format: megatron}}}}
inputs:
  tokens: {{kind: tokens, batch: 2, seq_len: 16, vocab_size: 64, seed: 1, labels: true}}
tolerances:
  tp2:
    - {{match: "*", kind: loss, atol: 1.0e-6, rtol: 0, why: "fp32 loss"}}
    - {{match: "*", phase: forward, atol: 5.0e-6, rtol: 0, why: "RowParallelLinear sums its K halves apart"}}
    - {{match: "*", phase: backward, atol: 1.0e-6, rtol: 1.0e-5, why: "fused and sharded grad sums"}}
cases:
  - {{name: converted_tp2_launched, baseline: hf, candidate: mc_tp2, inputs: tokens,
     mapping: "preset:megatron-qwen2.5", phases: [forward, backward], record: {{mode: tensor}},
     tolerances: tp2, weights: {{sync: false}}}}
  - {{name: gate_up_swapped_launched, baseline: hf, candidate: mc_fc1, inputs: tokens,
     mapping: "preset:megatron-qwen2.5", phases: [forward], record: {{mode: tensor}}, tolerances: tp2,
     weights: {{sync: false}}}}
"""
)


@pytest.mark.slow  # two launched 2-rank cases, twice; tox -e slow
def test_a_launched_tp2_side_loads_its_shards_of_a_converted_checkpoint(
    pytester: pytest.Pytester, run_pytest: RunPytest, hf_dir: Path, megatron_ckpts: Path
) -> None:
    (pytester.path / "align.yaml").write_text(CONFIG.format(hf=hf_dir, ck=megatron_ckpts), encoding="utf-8")
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out", "-rN")
    text = result.stdout.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    result.assert_outcomes(passed=2, failed=1)
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    first = {(c["name"], c["phase"]): c["first_divergence"] for c in report["cases"]}
    assert first[("converted_tp2_launched", "forward")] is None
    assert first[("converted_tp2_launched", "backward")] is None
    compared = {(c["name"], c["phase"]): c["compared"] for c in report["cases"]}
    assert compared[("converted_tp2_launched", "forward")] > 30, compared
    bug = first[("gate_up_swapped_launched", "forward")]
    assert (bug["name"], bug["origin"]) == ("model.layers.1.mlp.gate_proj", True), bug
