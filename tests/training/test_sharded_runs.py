"""A user's own loop on a sharded or replicated tiny Qwen2 recorded with ``Recorder`` under
torchrun (2 gloo ranks, CPU; ``sharded_run.py``): FSDP2 (``fully_shard``: resharding after the
forward or not, a ``MixedPrecisionPolicy``), DDP, DTensor tensor parallelism and ZeRO-1. Each
run trains the same loop bare first and then recorded, in the same processes: the recording
changes no loss, grad norm or parameter bit; DTensor grads and parameters are recorded with
the statistics of the full tensors they stand for (checked against torch's ``full_tensor()``),
under the model's own names and classes; ``StepEvidence``'s grad norm is the global one
(``clip_grad_norm_``'s); the manifest's ``parallel`` block says how the rank is sharded."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("sharded_run.py")


def torchrun(out: Path, *args: str, wait: str = "") -> list[dict[str, Any]]:
    """``sharded_run.py OUT ARGS --neutral`` on 2 ranks; each rank's result. ``wait``: the
    seconds a rank waits for the others at ``Recorder.start`` (``PRECALIGN_RANK_WAIT``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("PRECALIGN_RANK_WAIT", None)
    if wait:
        env["PRECALIGN_RANK_WAIT"] = wait
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*cmd, str(SCRIPT), str(out), "--neutral", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    return [json.loads((out / f"run.rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]


def trace(folder: Path) -> Any:
    from pytest_precalign.trace.native_io import read_trace

    return read_trace(folder)


def assert_neutral(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        for key in ("loss", "grad_norm", "params"):
            assert result["run"][key] == result["bare"][key], f"rank {rank}: recording changed {key}"


def assert_full_stats(folder: Path, full: dict[str, list[float]]) -> None:
    """The step's param grad records hold the full grads' statistics (torch's, gathered)."""
    grads = {r.name: r.stats for r in trace(folder).records if r.kind == "param_grad"}
    assert sorted(grads) == sorted(full)
    for name, (vmax, vmin, mean, norm) in full.items():
        stats = grads[name]
        assert stats is not None, name
        assert (stats.max, stats.min) == (vmax, vmin), name
        assert math.isclose(stats.norm, norm, rel_tol=1e-9), name
        assert math.isclose(stats.mean, mean, rel_tol=1e-6, abs_tol=1e-12), name


def test_fsdp2_recording_is_neutral_and_records_the_full_tensors(tmp_path: Path) -> None:
    """The issue's run: ``fully_shard`` on each decoder layer and the root, ``Recorder(mode=
    "stats")``: both ranks crashed (SIGSEGV in the param-grad hook on a DTensor grad)."""
    out = tmp_path / "fsdp2"
    results = torchrun(
        out, "--wrap", "fsdp2", "--check", "--disagree", "--absent", "never", "--alone", wait="2"
    )
    assert_neutral(results)
    # Ranks given other Recorder options raise on every rank at start(), none hangs.
    for result in results:
        include, steps, own_root = result["disagree"]
        assert own_root == ""  # ranks recording into roots of their own still meet
        assert "do not record alike at step 0" in include and "other Recorder options" in include
        assert "ranks [0] record this step, ranks [1] do not (steps=)" in steps
    # Rank 1 stopped recording after step 0 and ran step 1's forward (FSDP2's all-gathers):
    # rank 0's start() is not matched against them; it names rank 1 after the bounded wait.
    said, took = results[0]["absent"]
    assert "ranks [1] did not reach start() for step 1 within 2 s (PRECALIGN_RANK_WAIT)" in said
    assert 2 <= took < 30 and results[1]["absent"][0] == ""
    # Ranks that share no shard (a TP group of one rank each): rank 0 records alone, rank 1 with
    # no Recorder, then ranks=[0]: nobody waits for rank 1 (on main: "ranks [1] did not reach
    # start()" after the wait, then a ConfigError); ranks=[0] on the FSDP2 model is refused.
    for rank, result in enumerate(results):
        none, took_none, selected, took_selected, fsdp2 = result["alone"]
        assert (none, selected) == ("", "") and took_none < 2 and took_selected < 2, result["alone"]
        assert "ranks=[0] leaves out ranks [1] of a sharded model" in fsdp2
        assert (out / "alone" / "step1" / f"rank{rank}").is_dir() == (rank == 0)
        assert (out / "alone-ranks" / "step1" / f"rank{rank}").is_dir() == (rank == 0)
    assert trace(out / "alone" / "step1" / "rank0").records
    for rank in range(2):
        folder = out / "rec" / "step0" / f"rank{rank}"
        assert_full_stats(folder, results[rank]["run"]["full_grad_stats"])
        records = trace(folder).records
        names = {r.name for r in records}
        classes = {r.module_class for r in records}
        assert "model.layers.0.mlp.down_proj.weight" in names and "model.layers.1" in names
        assert not any("_fsdp" in n or "_checkpoint" in n or "_orig_mod" in n for n in names)
        assert "Qwen2DecoderLayer" in classes and not any(c.startswith("FSDP") for c in classes)
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        parallel = manifest["parallel"]
        assert (parallel["world_size"], parallel["dp"], parallel["dp_rank"]) == (2, 2, rank)
        assert parallel["dtensors"]["fsdp2"]["mesh"] == [2]
        assert parallel["dtensors"]["fsdp2"]["reshard_after_forward"] == [True]
        assert "combined over the mesh" in parallel["dtensors"]["summary"]["stats"]
        # the global grad norm (clip_grad_norm_'s, bit for bit), not one shard's
        scalars = manifest["scalars"]["0"]
        assert float.fromhex(results[rank]["run"]["grad_norm"][0]) == scalars["grad_norm"]
        assert math.isclose(scalars["param_norm"], results[rank]["run"]["param_norm"], rel_tol=1e-6)
    # the params' records: the same full-tensor statistics on both ranks
    params = [
        {r.name: r.stats for r in trace(out / "rec" / "step1" / f"rank{k}").records if r.kind == "param"}
        for k in range(2)
    ]
    assert params[0] == params[1] and len(params[0]) == len(results[0]["run"]["full_grad_stats"])


SLOW_RUNS = {
    "fsdp2-keep-stats": ("--wrap", "fsdp2-keep", "--check"),
    "fsdp2-mp-stats": ("--wrap", "fsdp2-mp", "--check"),
    "fsdp2-stats-step-grads": ("--wrap", "fsdp2", "--param-grads", "step", "--check"),
    "fsdp2-hash": ("--wrap", "fsdp2", "--mode", "hash"),
    "fsdp2-tensor": ("--wrap", "fsdp2", "--mode", "tensor", "--check"),
    "fsdp2-msprobe": ("--wrap", "fsdp2", "--format", "msprobe"),
    # DDP reduces the grads after the backward: the reduced ones are recorded at grads_ready()
    "ddp-stats": ("--wrap", "ddp", "--param-grads", "step", "--check"),
    "ddp-stats-backward": ("--wrap", "ddp"),
    "ddp-hash": ("--wrap", "ddp", "--mode", "hash", "--param-grads", "step"),
    "tp-stats": ("--wrap", "tp", "--check"),
    "tp-hash": ("--wrap", "tp", "--mode", "hash"),
    "zero1-stats": ("--wrap", "zero1", "--param-grads", "step", "--check"),
}


@pytest.mark.slow  # 12 torchrun runs of ~40 s; tox -e slow
@pytest.mark.parametrize("run", sorted(SLOW_RUNS))
def test_every_sharding_and_mode_is_recorded_without_harm(tmp_path: Path, run: str) -> None:
    args = SLOW_RUNS[run]
    out = tmp_path / run
    results = torchrun(out, *args)
    assert_neutral(results)
    for rank in range(2):
        if "msprobe" in run:
            assert list((out / "rec").rglob("dump.json")), "no msprobe dump written"
            continue
        folder = out / "rec" / "step0" / f"rank{rank}"
        records = trace(folder).records
        assert records and not any(c.startswith("FSDP") for c in {r.module_class for r in records})
        if "--check" in args and "tensor" not in run:
            assert_full_stats(folder, results[rank]["run"]["full_grad_stats"])
        if "hash" in run:
            grads = [r for r in records if r.kind == "param_grad"]
            assert grads and all(r.crc32 for r in grads)
        parallel = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["parallel"]
        if run.startswith("tp"):
            assert (parallel["tp"], parallel["dp"], parallel["tp_rank"]) == (2, 1, rank)
        else:
            assert (parallel["dp"], parallel["dp_rank"]) == (2, rank)
    if "hash" in run:  # a gathered DTensor / a reduced DDP grad: the same bytes on both ranks
        crcs = [
            {
                r.name: r.crc32
                for r in trace(out / "rec" / "step0" / f"rank{k}").records
                if r.kind == "param_grad"
            }
            for k in range(2)
        ]
        assert crcs[0] == crcs[1]


@pytest.mark.slow  # two torchrun runs of ~40 s; tox -e slow
def test_a_rank_late_to_start_within_the_wait_records_the_step(tmp_path: Path) -> None:
    """Rank 1 comes to step 1's ``start()`` 3 s after rank 0, within the default wait (600 s):
    no error, rank 0 waited for it, and both ranks' step 1 is recorded; beyond the wait, both
    ranks raise."""
    results = torchrun(tmp_path / "late", "--wrap", "fsdp2", "--steps", "1", "--absent", "late")
    assert [r["absent"][0] for r in results] == ["", ""]
    assert results[0]["absent"][1] >= 2.5
    for rank in range(2):
        assert trace(tmp_path / "late" / "absent" / "step1" / f"rank{rank}").records
    # Beyond a 1 s wait: rank 0 gives up naming rank 1, and rank 1, coming later, raises too.
    results = torchrun(tmp_path / "gave_up", "--wrap", "fsdp2", "--steps", "1", "--absent", "late", wait="1")
    assert "ranks [1] did not reach start() for step 1 within 1 s" in results[0]["absent"][0]
    assert "rank 1 reached start() for step 1 after rank 0 gave up waiting" in results[1]["absent"][0]


def torchrun_script(script: str, *args: str) -> None:
    """A test user script under torchrun, 2 ranks (DDP over gloo), from the repository's root."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*cmd, str(Path(__file__).with_name(script)), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-6000:]


def assert_ddp_manifests(root: Path) -> None:
    for rank in range(2):
        folders = sorted(root.glob(f"step*/rank{rank}"))
        assert folders, f"rank {rank} recorded nothing"
        manifest = json.loads((folders[0] / "manifest.json").read_text(encoding="utf-8"))
        assert (manifest["parallel"]["dp"], manifest["parallel"]["dp_rank"]) == (2, rank)


@pytest.mark.slow  # two torchrun runs; tox -e slow
def test_accelerate_steps_records_a_ddp_loop_without_harm(tmp_path: Path) -> None:
    """``AccelerateSteps`` in a custom Accelerate loop that Accelerate runs with DDP over gloo on
    2 ranks (``accelerate_run.py`` under torchrun): the same losses, grad norms, LRs and
    parameters as without it, on each rank, and each rank's recording."""
    common = ["--clip", "0.05", "--accumulate", "2", "--steps", "3"]
    torchrun_script("accelerate_run.py", str(tmp_path / "plain.json"), *common)
    torchrun_script("accelerate_run.py", str(tmp_path / "rec.json"), *common, "--root", str(tmp_path / "rec"))
    for rank in range(2):
        plain = json.loads((tmp_path / f"plain.json.rank{rank}").read_text(encoding="utf-8"))
        recorded = json.loads((tmp_path / f"rec.json.rank{rank}").read_text(encoding="utf-8"))
        assert recorded == plain
    assert_ddp_manifests(tmp_path / "rec")


@pytest.mark.slow  # two torchrun runs of the Trainer; tox -e slow
def test_precalign_callback_records_a_ddp_trainer_without_harm(tmp_path: Path) -> None:
    """``PrecalignCallback`` on a ``transformers.Trainer`` that runs DDP over gloo on 2 CPU ranks
    (``hf_user_run.py`` under torchrun; the Trainer's FSDP2 needs a CUDA/XPU/NPU device, see
    docs/training.md): the same logged losses, LRs and grad norms with and without it."""
    torchrun_script("hf_user_run.py", str(tmp_path), "rec=--trainer hf", "plain=--trainer hf --no-callback")
    for rank in range(2):
        recorded = json.loads((tmp_path / "rec" / f"logs.rank{rank}.json").read_text(encoding="utf-8"))
        plain = json.loads((tmp_path / "plain" / f"logs.rank{rank}.json").read_text(encoding="utf-8"))
        assert recorded == plain and recorded
    assert_ddp_manifests(tmp_path / "rec" / "rec")
