"""A user's own loop on a sharded or replicated tiny Qwen2, recorded with ``Recorder``, run by
torchrun (gloo, CPU): FSDP2 (``fully_shard`` on each decoder layer and the root), DDP, DTensor
tensor parallelism (``parallelize_module``) or DDP with ``ZeroRedundancyOptimizer``.

    python -m torch.distributed.run --standalone --nproc_per_node 2 sharded_run.py OUT
        [--wrap fsdp2|fsdp2-keep|fsdp2-mp|ddp|tp|zero1] [--mode stats|hash|tensor|off]
        [--format native|msprobe] [--param-grads backward|step] [--steps 2] [--neutral] [--check]
        [--disagree] [--absent never|late] [--alone]

Each rank writes ``OUT/run.rank<R>.json``: under ``"run"`` the loss and the grad norm
``clip_grad_norm_`` returned at each step (as ``float.hex``, to compare bitwise) and a sha256 of
the rank's parameters after the last step (``--check``: also each parameter's full grad's
statistics at step 0, gathered by torch); ``--neutral``: the same loop without a ``Recorder``
first, in the same process, under ``"bare"``; ``--mode off`` records nothing; ``--disagree``:
then ``Recorder.start`` with other options on each rank (what it raised, under ``"disagree"``);
``--absent never``: then rank 1 records step 0 and stops recording, its step 1 a forward only (FSDP2's
all-gathers, the user's collectives) while rank 0 calls ``start()``; ``late``: rank 1 comes to
step 1's ``start()`` 3 s after rank 0 (what each raised and how long its ``start()`` took, under
``"absent"``; ``PRECALIGN_RANK_WAIT`` bounds the wait); ``--alone``: then a model whose TP group is
the rank alone (``init_device_mesh(("dp", "tp"), (2, 1))``, its MLPs parallelised over
``mesh["tp"]``: two DP replicas) recorded by rank 0 only, rank 1 with no ``Recorder``, then
with ``Recorder(ranks=[0])`` on both ranks, then ``ranks=[0]`` on the FSDP2 model whose shards
rank 1 holds (what each raised and the seconds its ``start()`` calls took, under ``"alone"``).
The recording
(``OUT/rec``) holds each step's records and ``StepEvidence``'s scalars.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pytest_precalign import Recorder  # noqa: E402
from pytest_precalign.steps.step_evidence import StepEvidence, group_settings  # noqa: E402
from tests.helpers.tiny_lm import tiny_causal_lm  # noqa: E402

ROWS, LENGTH = 4, 8  # rows per rank and step


def wrapped(model: Any, wrap: str, world: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    if wrap.startswith("fsdp2"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kwargs: dict[str, Any] = {"mesh": mesh}
        if wrap == "fsdp2-keep":
            kwargs["reshard_after_forward"] = False
        if wrap == "fsdp2-mp":
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model
    if wrap == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for layer in model.model.layers:
            plan = {
                "gate_proj": ColwiseParallel(),
                "up_proj": ColwiseParallel(),
                "down_proj": RowwiseParallel(),
            }
            parallelize_module(layer.mlp, mesh, plan)
        return model
    return torch.nn.parallel.DistributedDataParallel(model)  # ddp, zero1


def params_sha(model: Any) -> str:
    whole = hashlib.sha256()
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        whole.update(name.encode())
        whole.update(local.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return whole.hexdigest()


def full(t: Any) -> Any:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_stats(model: Any) -> dict[str, list[float]]:
    """(max, min, mean, norm) of each parameter's full grad, gathered by torch (the check)."""
    found = {}
    model = getattr(model, "module", model)  # DDP's: the records name the model inside it
    for name, p in model.named_parameters():
        g = full(p.grad).detach().double()
        found[name] = [float(g.max()), float(g.min()), float(g.mean()), float(torch.linalg.vector_norm(g))]
    return found


def train(options: argparse.Namespace, mode: str) -> dict[str, Any]:
    """The user's loop; ``mode`` "off": without a Recorder."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = wrapped(tiny_causal_lm(vocab=128, hidden=32, layers=2), options.wrap, world)
    if options.wrap == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer: Any = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    ids = torch.randint(
        0, 128, (options.steps, world, ROWS, LENGTH), generator=torch.Generator().manual_seed(1)
    )
    rec = None
    if mode != "off":
        rec = Recorder(options.out / "rec", mode=mode, format=options.format, param_grads=options.param_grads)
    evidence = StepEvidence(model.parameters())
    if rec is not None:
        rec.record_initial_params(model)
    losses, norms, full_grads, param_norm = [], [], {}, None
    for step in range(options.steps):
        batch = ids[step, 0 if options.wrap == "tp" else rank]  # tensor-parallel ranks share the rows
        if rec is not None:
            rec.start(model)
            evidence.begin()
        out = model(input_ids=batch, labels=batch)
        if rec is not None:
            rec.record_output("loss", out.loss)
        out.loss.backward()
        if rec is not None and options.param_grads == "step":
            rec.grads_ready()
        if rec is not None:
            evidence.grads_before_clip()
            if options.check and step == 0:
                full_grads = full_stats(model)
        if options.wrap == "tp":  # DTensor and plain grads: torch's clipping takes no mix
            norm = torch.nn.utils.get_total_norm([full(p.grad) for p in model.parameters()])
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            norm = full(norm)
        if rec is not None:
            evidence.grads_after_clip()
            lr, wd = group_settings(optimizer)
        optimizer.step()
        if options.check and step == 0 and rec is not None:
            squares = [full(p).detach().double().square().sum() for p in model.parameters()]
            param_norm = float(torch.stack(squares).sum().sqrt())
        optimizer.zero_grad()
        losses.append(float(out.loss.detach()).hex())
        norms.append(float(norm).hex())
        if rec is not None:
            rec.record_scalars(evidence.finish(step, loss=float(out.loss.detach()), lr=lr, weight_decay=wd))
            rec.stop()
            rec.step()
    if rec is not None:
        rec.close()
    return {
        "loss": losses,
        "grad_norm": norms,
        "params": params_sha(model),
        "full_grad_stats": full_grads,
        "param_norm": param_norm,
    }


def disagree(options: argparse.Namespace) -> list[str]:
    """Ranks given other Recorder options (rank 1 ``include=``, then other ``steps=``), then the
    same options in a root of each rank's own: what ``start`` raised on this rank (the first two
    must raise, none may hang; the last must not)."""
    from pytest_precalign.errors import RecorderError

    rank, world = dist.get_rank(), dist.get_world_size()
    model = wrapped(tiny_causal_lm(vocab=128, hidden=32, layers=2), options.wrap, world)
    said = []
    for root, kw in (
        ("disagree-include", {"include": ("model.layers.0",) if rank else ()}),
        ("disagree-steps", {"steps": [rank]}),
        # Each rank its own root (a folder per rank), the same options: one run, no disagreement.
        (f"own-root-rank{rank}", {}),
    ):
        rec = Recorder(options.out / root, **kw)  # type: ignore[arg-type]
        try:
            rec.start(model)
            said.append("")
        except RecorderError as e:
            said.append(str(e))
        rec.close()
    return said


def absent(options: argparse.Namespace) -> list[Any]:
    """Rank 1 not at step 1's ``start()`` (``never``) or late to it (``late``): rank 0's
    ``start()`` (what it raised, its seconds), then both ranks' forward, which must match."""
    import time

    from pytest_precalign.errors import RecorderError

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = wrapped(tiny_causal_lm(vocab=128, hidden=32, layers=2), options.wrap, world)
    batch = torch.randint(0, 128, (ROWS, LENGTH), generator=torch.Generator().manual_seed(rank))
    rec = Recorder(options.out / "absent")
    said, took = "", 0.0
    for step in range(2):
        if step == 1 and rank == 1 and options.absent == "never":
            model(input_ids=batch, labels=batch)  # no start(): the user's own collectives only
            continue
        if step == 1 and rank == 1:
            time.sleep(3)
        began = time.monotonic()
        try:
            rec.start(model)
        except RecorderError as e:
            said = str(e)
        took = time.monotonic() - began
        model(input_ids=batch, labels=batch)
        rec.stop()
        rec.step()
    rec.close()
    return [said, took]


def alone(options: argparse.Namespace) -> list[Any]:
    """Ranks that share no shard, recorded on rank 0 only (module doc): [what rank 0's Recorder
    without one on rank 1 raised, its start()s' seconds, the same with ranks=[0], what
    ranks=[0] on the FSDP2 model raised]."""
    import time

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from pytest_precalign.errors import ConfigError, RecorderError

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = tiny_causal_lm(vocab=128, hidden=32, layers=2)
    for layer in model.model.layers:
        plan = {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(), "down_proj": RowwiseParallel()}
        parallelize_module(layer.mlp, mesh["tp"], plan)
    batch = torch.randint(0, 128, (ROWS, LENGTH), generator=torch.Generator().manual_seed(rank))
    said: list[Any] = []
    for root, kw in (("alone", None), ("alone-ranks", {"ranks": [0]})):
        rec = None if kw is None and rank else Recorder(options.out / root, **(kw or {}))  # type: ignore[arg-type]
        began, raised = time.monotonic(), ""
        for _ in range(2):
            try:
                if rec is not None:
                    rec.start(model)
            except RecorderError as e:
                raised = str(e)
            model(input_ids=batch, labels=batch).loss.backward()
            if rec is not None:
                rec.stop()
                rec.step()
        if rec is not None:
            rec.close()
        said += [raised, time.monotonic() - began]
    sharded = wrapped(tiny_causal_lm(vocab=128, hidden=32, layers=2), "fsdp2", world)
    try:
        Recorder(options.out / "alone-fsdp2", ranks=[0]).start(sharded)
        said.append("")
    except ConfigError as e:
        said.append(str(e))
    return said


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--wrap", default="fsdp2")
    parser.add_argument("--mode", default="stats")
    parser.add_argument("--format", default="native")
    parser.add_argument("--param-grads", default="backward")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--neutral", action="store_true", help="the loop bare first, in the same process")
    parser.add_argument("--check", action="store_true", help="also the full grads' statistics, by torch")
    parser.add_argument("--disagree", action="store_true", help="then ranks given other Recorder options")
    parser.add_argument("--absent", choices=("never", "late"), help="then rank 1 not at or late to a start()")
    parser.add_argument("--alone", action="store_true", help="then ranks sharing no shard, rank 0 recording")
    options = parser.parse_args(argv)
    dist.init_process_group("gloo")
    result = {}
    if options.neutral:
        result["bare"] = train(options, "off")
    result["run"] = train(options, options.mode)
    if options.disagree:
        result["disagree"] = disagree(options)
    if options.absent:
        result["absent"] = absent(options)
    if options.alone:
        result["alone"] = alone(options)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / f"run.rank{dist.get_rank()}.json").write_text(json.dumps(result), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
