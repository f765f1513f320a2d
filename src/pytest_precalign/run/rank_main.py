"""One rank of a launched model: ``python -m torch.distributed.run --nproc_per_node N -m
pytest_precalign.run.rank_main WORKDIR`` (``run/launch.py`` prepares WORKDIR and starts it).

Each rank joins the gloo group torchrun set up, builds its part of the Megatron model (its
pipeline stage and tensor-parallel shard, inside ``sources.runtime``), loads its shard of the
full TP=1 weights the parent synced (``tensor_parallel.rank_shard``; layers renumbered
to the stage's local indices), and runs the case's steps with the side's launchable trainer
(``run.trainers``: its ``train_rank``, e.g. megatron-core's own stack, or the tool's loop
through megatron-core's pipeline schedule), recording each step with the public ``Recorder``
into ``WORKDIR/out/step<N>/rank<R>``. A rank that raises writes ``WORKDIR/error<R>.json``
(type, one-line message, traceback) for the parent to name.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ..errors import CaseError
from ..sources import one_line
from ..sources.inputs import CaseInputs

JOB_FILE = "job.pkl"
INPUTS_FILE = "inputs.pt"
WEIGHTS_FILE = "weights.safetensors"
OUT_DIR = "out"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pytest_precalign.run.rank_main WORKDIR (under torchrun)", file=sys.stderr)
        return 2
    work = Path(args[0])
    rank = int(os.environ.get("RANK", "0"))
    # The ranks share the machine's cores: one thread each (results do not depend on it on CPU).
    torch.set_num_threads(1)
    try:
        run_rank(work, rank)
    except BaseException as exc:
        message = {
            "type": type(exc).__name__,
            "message": one_line(exc),
            "traceback": traceback.format_exc(),
            "time": time.time(),
        }
        (work / f"error{rank}.json").write_text(json.dumps(message), encoding="utf-8")
        raise
    return 0


def run_rank(work: Path, rank: int) -> None:
    import torch.distributed as dist

    from ..recording.determinism import deterministic
    from ..sources import build_model, runtime
    from .trainers import launched_trainer
    from .trainers.skeleton import StepSkeleton

    job: dict[str, Any] = pickle.loads((work / JOB_FILE).read_bytes())
    spec, case = job["spec"], job["case"]
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(job["timeout"])))
    try:
        # sources.runtime sees the group and creates Megatron's model-parallel state
        # (tensor x pipeline) and the CPU RNG tracker, then tears them down.
        with deterministic(bool(job["deterministic"])), runtime(spec):
            model = build_model(spec, job["base_dir"])
            weights = work / WEIGHTS_FILE
            if weights.exists():
                load_rank_weights(model.module, weights, rank)
            blob = torch.load(work / INPUTS_FILE, weights_only=False)
            later = tuple(CaseInputs(b["model_inputs"], b["labels"]) for b in blob.get("later", ()))
            inputs = CaseInputs(blob["model_inputs"], blob["labels"], later)
            trainer = launched_trainer(str(job["trainer"]))
            trainer.train_rank(
                model, inputs, case, StepSkeleton(None, int(job["seed"])), work / OUT_DIR, rank
            )
    finally:
        dist.destroy_process_group()


def load_rank_weights(module: torch.nn.Module, file: Path, rank: int) -> None:
    """This rank's shard of the full TP=1 state: its stage's layers (local index + the
    stage's layer offset), sharded over the tensor-parallel ranks by the layout rules."""
    from safetensors.torch import load_file

    from ..parallel.merge import globalize, globalize_expert
    from ..steps.layout_probe import layer_offsets
    from .tensor_parallel import rank_shard

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps

        tp, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        ep, ep_rank = ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_rank()
    full = load_file(str(file))
    offsets = layer_offsets(module)
    local = int(getattr(getattr(module, "config", None), "num_moe_experts", None) or 0) // ep
    with torch.no_grad():
        for name, param in module.named_parameters():
            global_name = globalize_expert(globalize(name, offsets), ep_rank, local)
            if global_name not in full:
                raise CaseError(f"rank {rank}: the TP=1 weights have no {global_name!r} (local {name!r})")
            shard = rank_shard(global_name, full[global_name], tp, tp_rank)
            if tuple(shard.shape) != tuple(param.shape):
                raise CaseError(
                    f"rank {rank}: shard of {global_name} has shape {list(shard.shape)}, "
                    f"the rank's parameter {name} {list(param.shape)}"
                )
            param.copy_(shard)


if __name__ == "__main__":
    raise SystemExit(main())
