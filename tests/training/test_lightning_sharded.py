"""``PrecalignLightningCallback`` on Lightning's own data-parallel strategies, run as a user runs
them (``lightning_run.py`` under torchrun: 2 gloo ranks, CPU, a tiny Llama, 4 steps of a 4-row
global batch, AdamW with warmup then cosine): ``strategy="ddp"`` and FSDP2 through
``ModelParallelStrategy`` (``fully_shard`` in ``configure_model``). Recording changes no loss,
LR, grad norm or parameter on any rank (the same job bare), and the recording compares clean
with a 1-rank Lightning run of the same global batch (``precalign compare`` exit 0: the ranks'
rows joined into the global batch's); a run whose ranks shuffle their rows (Lightning's own
sampler) is ``data`` at step 0 against it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

from .framework_runs import HERE, _env, compare, run_scripts  # noqa: E402

COMMON = ["--model", "llm", "--accumulate", "1", "--steps", "4"]


def torchrun(out: Path, name: str, *args: str) -> list[dict[str, Any]]:
    """``lightning_run.py`` on 2 ranks; what each rank saw."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    script = [str(HERE / "lightning_run.py"), str(out / f"{name}.json"), *COMMON, "--batch", "2", *args]
    done = subprocess.run([*cmd, *script], cwd=out, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-6000:]
    return [json.loads((out / f"{name}.json.rank{r}").read_text()) for r in range(2)]


@pytest.mark.slow  # a 1-rank run and 4 torchrun jobs of Lightning (~1 min each); tox -e slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("strategy", ["ddp", "model_parallel"])
def test_a_sharded_lightning_run_is_recorded_without_harm_and_compares_with_one_rank(
    tmp_path: Path, strategy: str
) -> None:
    one = run_scripts("lightning_run.py", {"one": [*COMMON, "--batch", "4", "--root", "one"]}, tmp_path)[
        "one"
    ]
    bare = torchrun(tmp_path, "bare", "--strategy", strategy)
    recorded = torchrun(tmp_path, "rec", "--strategy", strategy, "--root", "rec")
    for rank in range(2):
        for key in ("micro_losses", "lr", "grad_norm", "params"):
            assert recorded[rank][key] == bare[rank][key], f"rank {rank}: recording changed {key}"
    assert recorded[0]["params"] == recorded[1]["params"]  # one model, every rank
    manifest = json.loads((tmp_path / "rec" / "step0" / "rank1" / "manifest.json").read_text())
    assert (manifest["parallel"]["world_size"], manifest["parallel"]["dp"]) == (2, 2)
    done = compare(tmp_path / "one", tmp_path / "rec", "--report", str(tmp_path / "report"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["training"]["steps_compared"] == 4
    judged = {case["phase"]: case["passed"] for case in report["cases"]}
    assert judged == {"forward": True, "backward": True, "step": True}
    # the 1-rank run's loss of each step is the mean of the ranks' (their rows' halves)
    joined = [
        (a + b) / 2 for a, b in zip(recorded[0]["micro_losses"], recorded[1]["micro_losses"], strict=True)
    ]
    assert one["micro_losses"] == pytest.approx(joined, rel=1e-5) and len(joined) == 4


@pytest.mark.slow  # a 1-rank run and a torchrun job of Lightning (~1.5 min); tox -e slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_dp_run_whose_ranks_shuffle_their_rows_is_data_against_one_rank(tmp_path: Path) -> None:
    """Lightning's own ``DistributedSampler`` (``use_distributed_sampler`` left on) shuffles the
    rows: each step's global batch holds other rows than the 1-rank run's. The ranks' rows,
    joined (their rows hashes summed), are compared with the 1-rank run's: ``data`` at step 0,
    not a forward origin at the embedding that read them."""
    run_scripts("lightning_run.py", {"one": [*COMMON, "--batch", "4", "--root", "one"]}, tmp_path)
    torchrun(tmp_path, "shuffled", "--strategy", "ddp", "--root", "shuffled", "--shuffled")
    done = compare(tmp_path / "one", tmp_path / "shuffled", "--report", str(tmp_path / "report"))
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    training = json.loads((tmp_path / "report" / "report.json").read_text())["training"]
    assert (training["first_divergent_step"], training["first_divergent"], training["origin"]) == (
        0,
        "data",
        "rows",
    )
    assert "the candidate's DP replicas' rows joined" in training["evidence"]
