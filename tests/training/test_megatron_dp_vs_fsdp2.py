"""A megatron-core data-parallel run (DP=2, TP=1; ``example_suites/distributed/train_megatron.py
--split-rows``: each replica trains its row of every step, grads averaged over the replicas)
against its Hugging Face twin trained with FSDP2 on 2 ranks (``train_hf.py --fsdp2``), both
recorded with ``Recorder(mode="stats")`` under torchrun (gloo, CPU) from the same weights and
rows: both sides' replicas are joined into the global batch's records (the Megatron side's
``[s, b, h]`` on dim 1) and compare aligned through ``preset:megatron-qwen2.5``; a fault on the
Megatron side's last replica (its layer 2 MLP output x 1.01) is named at step 0, in the forward,
at ``model.layers.2.mlp``, and rank 1; and the DP=2 Megatron run compares aligned with DP=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "example_suites" / "distributed"
MAPPING = [
    "--mapping",
    "preset:megatron-qwen2.5",
    "--var",
    "num_attention_heads=4",
    "--var",
    "num_key_value_heads=2",
]
TABLE = ["--tolerances", str(EXAMPLE / "tolerances.yaml")]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }


def torchrun(nproc: int, script: str, out: Path, *args: str) -> Path:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    run = [str(EXAMPLE / script), "--steps", "2", "--mode", "stats", "--out", str(out), *args]
    done = subprocess.run([*cmd, *run], env=_env(), cwd=EXAMPLE, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def compare(baseline: Path, candidate: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest_precalign", "compare", str(baseline), str(candidate), *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # four torchrun jobs (~1 min each); tox -e slow
def test_a_megatron_dp2_run_compares_with_an_fsdp2_run_and_a_fault_is_named_by_rank(tmp_path: Path) -> None:
    fsdp2 = torchrun(2, "train_hf.py", tmp_path / "hf_fsdp2", "--fsdp2")
    dp2 = torchrun(2, "train_megatron.py", tmp_path / "meg_dp2", "--split-rows")
    fault = torchrun(2, "train_megatron.py", tmp_path / "meg_dp2_fault", "--split-rows", "--fault")
    dp1 = torchrun(1, "train_megatron.py", tmp_path / "meg_dp1")

    clean = compare(fsdp2, dp2, *MAPPING, *TABLE)
    assert clean.returncode == 0, clean.stdout[-4000:] + clean.stderr[-2000:]
    verdicts = [line for line in clean.stdout.splitlines() if line.startswith(("PASSED", "FAILED"))]
    assert len(verdicts) == 3 and all(line.startswith("PASSED") for line in verdicts), verdicts

    found = compare(fsdp2, fault, *MAPPING, *TABLE)
    assert found.returncode == 1, found.stdout[-4000:] + found.stderr[-2000:]
    assert "Step 0 diverged first: forward, origin model.layers.2.mlp" in found.stdout, found.stdout[-4000:]
    assert "the candidate's DP rank(s) rank1 computed it differently" in found.stdout, found.stdout[-4000:]
    assert "DP rank rank0 (row 0 of the global batch) within tolerance" in found.stdout

    same = compare(dp1, dp2, *TABLE)
    assert same.returncode == 0, same.stdout[-4000:] + same.stderr[-2000:]
