"""One rank of a launched model: ``python -m torch.distributed.run --nproc_per_node N -m
pytest_precalign.run.rank_main WORKDIR`` (``run/launch.py`` prepares WORKDIR and starts it).

Each rank joins the gloo group torchrun set up, builds its part of the Megatron model (its
pipeline stage and tensor-parallel shard, inside ``sources.runtime``), loads its shard of the
full TP=1 weights the parent synced (``tensor_parallel.rank_shard``; layers renumbered
to the stage's local indices), and runs the case's steps: with megatron-core's own stack
(``megatron_training.train_rank_with_megatron``; a Megatron model's default trainer) or, with
``training: loop``, through megatron-core's pipeline schedule (``get_forward_backward_func``)
with the case's torch optimizer, recording each step with
the public ``Recorder`` into ``WORKDIR/out/step<N>/rank<R>``. As in Megatron's training loop,
the schedule ends the backward with megatron-core's ``finalize_model_grads`` (``grad_sync``:
e.g. the tensor-parallel all-reduce of q/k layernorm grads), and parameter grads are recorded
after it, as the optimizer sees them (``param_grads="step"``). A rank that raises writes
``WORKDIR/error<R>.json`` (type, one-line message, traceback) for the parent to name.
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
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..errors import CaseError
from ..sources import LoadedModel, one_line
from ..sources.inputs import CaseInputs
from .loop_training import grouped_optimizer, param_groups
from .side import causal_lm_loss

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
            if job.get("trainer") == "megatron":
                from .megatron_training import train_rank_with_megatron

                train_rank_with_megatron(model, inputs, case, int(job["seed"]), work / OUT_DIR, rank)
            else:
                run_steps(model, inputs, case, int(job["seed"]), work / OUT_DIR)
    finally:
        dist.destroy_process_group()


def load_rank_weights(module: torch.nn.Module, file: Path, rank: int) -> None:
    """This rank's shard of the full TP=1 state: its stage's layers (local index + the
    stage's layer offset), sharded over the tensor-parallel ranks by the layout rules."""
    from safetensors.torch import load_file

    from ..parallel.merge import globalize, globalize_expert
    from ..training.layout_probe import layer_offsets
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


def run_steps(model: LoadedModel, inputs: CaseInputs, case: Any, seed: int, out: Path) -> None:
    """The case's steps through megatron-core's schedule, one recorded folder per step."""
    from ..recording.determinism import seed_everything
    from ..training import Recorder, megatron_cpu
    from .grad_sync import use_megatron_grad_finalization

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel import get_forward_backward_func

    backward = "backward" in case.phases
    if backward and case.loss not in ("causal_lm", "mean"):
        raise CaseError(
            f"case {case.name!r}: launched ranks compute loss causal_lm or mean, not {case.loss!r}"
        )
    module = model.module
    module.train(case.train)
    if backward:
        use_megatron_grad_finalization(module)
    groups = stage_param_groups(module, case.optimizer)
    optimizer = grouped_optimizer(case.optimizer, groups) if "step" in case.phases else None
    rec = Recorder(
        out,
        mode=case.record.mode,
        level=case.record.level,
        inputs=case.record.inputs,
        grads=backward,
        include=case.record.include,
        exclude=case.record.exclude,
        params="step" in case.phases,  # no optimizer step: no parameters to compare
        param_grads="step",  # after finalize_model_grads: the grads the optimizer steps on
    )
    data = inputs.to(next(module.parameters()).device)
    batch, seq = data.model_inputs["input_ids"].shape
    schedule = get_forward_backward_func()
    for step in range(case.steps if backward else 1):
        seed_everything(seed + step)  # dropout, if any, draws the same numbers as in-process
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        rec.start(module)
        with megatron_cpu(), warnings.catch_warnings(), torch.set_grad_enabled(backward):
            warnings.simplefilter("ignore")
            schedule(
                forward_step_func=partial(_forward_step, model, rec, case),
                data_iterator=iter([data.batch(step)]),  # a new batch each step, as in-process
                model=[module],
                num_microbatches=1,
                seq_length=seq,
                micro_batch_size=batch,
                forward_only=not backward,
            )
        if backward:
            rec.grads_ready()
        if optimizer is not None:
            optimizer.step()
        rec.stop()
        rec.step()


def stage_param_groups(module: torch.nn.Module, spec: Any) -> Any:
    """The loop's parameter groups of this rank's stage (no decay on 1-d params, as in process),
    ``no_decay`` globs read in the model's global names: a stage's local layer 0 is global
    layer ``offset``."""
    from ..parallel.merge import globalize
    from ..training.layout_probe import layer_offsets

    offsets = layer_offsets(module)
    named = [(globalize(name, offsets), param) for name, param in module.named_parameters()]
    return param_groups(named, spec)


def _forward_step(model: LoadedModel, rec: Any, case: Any, data_iterator: Any, module: Any) -> Any:
    data: CaseInputs = next(data_iterator)
    output = model(data.model_inputs)  # later stages take their input from the previous one
    return output, partial(_loss, rec, case, data)


def _loss(rec: Any, case: Any, data: CaseInputs, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """On the last stage: the logits ([b, s, vocab]) and the loss, recorded as in-process.
    Expert-parallel ranks run the same batch, and each expert serves every rank's tokens: only
    the first rank's loss is back-propagated (the others' times 0), so an expert's grad is that
    of one batch, as Megatron's data-parallel averaging makes it; the merge keeps the first
    rank's records of everything but the other ranks' experts."""
    logits_record = rec.record_output("logits", logits)
    if case.loss == "mean":
        loss = logits.float().mean()
    elif case.loss == "causal_lm" and data.labels is not None:
        loss = causal_lm_loss(logits, data.labels)
    else:  # forward only, no loss recorded
        return logits.float().mean() * 0.0, {}
    deps = (logits_record.id,) if logits_record is not None else ()
    rec.record_output("loss", loss, deps)
    return (loss * 0.0 if _ep_rank() else loss), {"loss": loss.detach()}


def _ep_rank() -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps

    return int(ps.get_expert_model_parallel_rank())


if __name__ == "__main__":
    raise SystemExit(main())
