"""Run one side of a case on real ranks under torchrun and bring back one TP=1 trace.

A Megatron model with ``tensor_parallel``/``pipeline_parallel`` > 1 or ``launch: {nproc: N}``
runs as ``python -m torch.distributed.run --standalone --nproc_per_node N -m
pytest_precalign.run.rank_main WORKDIR`` (gloo on CPU). WORKDIR holds what the ranks need
(the job, the inputs, the full TP=1 weights the parent synced); each rank records into
``WORKDIR/out/step<N>/rank<R>`` and the parent merges them as ``precalign compare`` merges any
rank folders (``parallel.sides``), reading every merged tensor before WORKDIR goes.

Failures are one ``CaseError``: the rank that raised first and its exception's last line
(``error<R>.json``), else torchrun's exit code and the last line of its output. A run that
does not finish within the timeout has its whole process group (torchrun and the ranks)
killed: a stuck collective never hangs pytest.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.launch import launch_timeout, launched, world_size
from ..errors import CaseError
from ..parallel.rules import MEGATRON_GPT_RULES, ShardRule
from ..steps.trainer_registry import PLAIN, trainer_info, trainer_names
from ..trace.records import Trace
from ..untrusted import read_json
from .rank_main import INPUTS_FILE, JOB_FILE, OUT_DIR, WEIGHTS_FILE
from .trainers import launched_trainer, side_trainer

if TYPE_CHECKING:
    import torch

    from ..config.specs import CaseSpec, ModelSpec
    from ..sources.inputs import CaseInputs

RANK_MODULE = "pytest_precalign.run.rank_main"


def is_launched(spec: ModelSpec) -> bool:
    return spec.source == "megatron" and launched(spec.options)


def in_process_twin(spec: ModelSpec) -> ModelSpec:
    """The TP=1, single-stage (and single expert-parallel rank) twin of a launched model, built in this process to receive the
    synced weights the ranks load their shards of."""
    if not is_launched(spec):
        return spec
    dropped = ("pipeline_parallel", "expert_parallel", "data_parallel", "launch")
    options = {k: v for k, v in spec.options.items() if k not in dropped}
    return replace(spec, options={**options, "tensor_parallel": 1})


def torchrun_command(nproc: int, work: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free local rendezvous port: concurrent runs do not collide
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(nproc),
        "-m",
        RANK_MODULE,
        str(work),
    ]


def run_launched(
    spec: ModelSpec,
    base_dir: Path,
    case: CaseSpec,
    inputs: CaseInputs,
    full_weights: Mapping[str, torch.Tensor] | None,
    manifest: Mapping[str, Any],
    seed: int,
    *,
    timeout: float | None = None,
) -> Trace:
    """Run ``spec`` on its ranks through the case's steps; the merged TP=1 trace."""
    name = side_trainer(case, manifest.get("side"))
    info = trainer_info(name)
    if not info.launchable:
        able = ", ".join(n for n in trainer_names() if trainer_info(n).launchable)
        raise CaseError(
            f"{spec.where}: models.{spec.name}: a side launched under torchrun cannot train with "
            f"training: {name} ({info.framework}); launchable: {able}"
        )
    split = int(spec.options.get("data_parallel", 1)) > 1
    if split and not info.data_parallel:
        able = ", ".join(n for n in trainer_names() if trainer_info(n).data_parallel)
        raise CaseError(
            f"{spec.where}: models.{spec.name}.data_parallel: the replicas split each step's batch "
            f"when the side's trainer splits it: needs phase step and training: {able}"
        )
    with tempfile.TemporaryDirectory(prefix="precalign-launch-") as tmp:
        out = launch_ranks(
            spec, base_dir, case, inputs, full_weights, seed, Path(tmp), timeout=timeout, trainer=name
        )
        run = launched_trainer(name).launched_evidence(out, world_size(spec.options), full_weights)
        return merge_launched(out, manifest, params="step" in case.phases, data_split=split).with_run(run)


def merge_launched(
    root: Path,
    manifest: Mapping[str, Any],
    *,
    params: bool = True,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
    data_split: bool = False,
) -> Trace:
    """The ranks' ``step<N>/rank<R>`` folders under ``root`` merged into one trace, its tensors
    read into memory (the folders are removed once merged); ``params=False`` drops the
    parameter records (the in-process path records them only after an optimizer step);
    ``data_split``: the DP replicas trained on different micro-batches (``parallel/data_split.py``)."""
    from ..parallel.sides import load_parallel_side

    merged = load_parallel_side(root, rules=rules, data_split=data_split)
    if merged is None:
        raise CaseError(f"launched ranks: nothing was recorded under {root}")
    records = tuple(
        replace(r, seq=i) for i, r in enumerate(r for r in merged.records if params or r.kind != "param")
    )
    tensors = {r.tensor_key: merged.tensors[r.tensor_key] for r in records if r.tensor_key is not None}
    kept = ("record_mode", "record_level", "parallel_merge")
    out = {**dict(manifest), **{k: merged.manifest[k] for k in kept if k in merged.manifest}}
    notes = merged.notes
    trace = Trace(manifest=out, records=records, tensors=tensors)
    return trace.with_notes(replica_mismatches=notes.replica_mismatches, steps=notes.steps)


def launch_ranks(
    spec: ModelSpec,
    base_dir: Path,
    case: CaseSpec,
    inputs: CaseInputs,
    full_weights: Mapping[str, torch.Tensor] | None,
    seed: int,
    work: Path,
    *,
    timeout: float | None = None,
    trainer: str = PLAIN,
) -> Path:
    """Run the ranks with ``work`` as their folder; the root of their ``step<N>/rank<R>``
    folders. ``full_weights``: a TP=1 state (``named_parameters``) each rank loads its part
    of; None keeps Megatron's own initialisation."""
    import torch
    from safetensors.torch import save_file

    nproc = world_size(spec.options)
    what = f"{spec.where}: models.{spec.name} ({nproc} ranks under torchrun)"
    _check(spec, case, what)
    timeout = launch_timeout(spec.options) if timeout is None else timeout
    later = [{"model_inputs": dict(b.model_inputs), "labels": b.labels} for b in inputs.later]  # steps 1..
    torch.save(
        {"model_inputs": dict(inputs.model_inputs), "labels": inputs.labels, "later": later},
        work / INPUTS_FILE,
    )
    if full_weights is not None:
        save_file({k: v.detach().contiguous() for k, v in full_weights.items()}, str(work / WEIGHTS_FILE))
    job = {
        # The ranks load their shards of full_weights, not the checkpoint the parent loaded whole.
        "spec": replace(spec, options={k: v for k, v in spec.options.items() if k != "weights"}),
        "base_dir": base_dir,
        "case": replace(case, mapping=None),  # the ranks never map; keeps the pickle small
        "seed": seed,
        # The parent runs inside determinism(); the ranks repeat what it set.
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "timeout": timeout,
        "trainer": trainer,  # the side's launchable trainer (``run.trainers``), run by each rank
    }
    (work / JOB_FILE).write_bytes(pickle.dumps(job))
    run_torchrun(nproc, work, timeout, what)
    return work / OUT_DIR


def _check(spec: ModelSpec, case: CaseSpec, what: str) -> None:
    if case.record.mode != "tensor":
        raise CaseError(
            f"{what}: case {case.name!r} records in {case.record.mode!r} mode; merging the "
            "ranks' shards needs record: {mode: tensor}"
        )
    if spec.device != "cpu":
        raise CaseError(f"{what}: launched ranks run on the CPU (gloo) only, not {spec.device!r}")


def run_torchrun(nproc: int, work: Path, timeout: float, what: str) -> None:
    """torchrun in its own process group, killed as a whole on timeout; one clear error."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    log = work / "torchrun.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            torchrun_command(nproc, work),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: torchrun and every rank
        )
        (work / "torchrun.pid").write_text(str(proc.pid), encoding="utf-8")
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise CaseError(
                f"{what}: the ranks did not finish within {timeout:.0f} s; torchrun and its ranks "
                f"were killed{rank_error_suffix(work)}"
            ) from None
        except BaseException:  # KeyboardInterrupt: never leave the ranks behind
            kill_group(proc)
            raise
    if code != 0:
        raise CaseError(f"{what}: {failure(work, code, log)}")


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of ``proc`` (which we started with its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def first_rank_error(work: Path) -> tuple[int, dict[str, Any]] | None:
    """The rank that raised first (errors of the other ranks usually follow from it)."""
    found = []
    for file in work.glob("error*.json"):
        try:
            found.append((int(file.stem[5:]), read_json(file, CaseError)))
        except (ValueError, CaseError):
            continue
    if not found:
        return None
    return min(found, key=lambda item: (float(item[1].get("time", 0.0)), item[0]))


def rank_error_suffix(work: Path) -> str:
    first = first_rank_error(work)
    if first is None:
        return ""
    rank, data = first
    return f" (rank {rank} raised {data['type']}: {data['message']})"


def failure(work: Path, code: int, log: Path) -> str:
    first = first_rank_error(work)
    if first is not None:
        rank, data = first
        return f"rank {rank} failed: {data['type']}: {data['message']}"
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return f"torchrun exited with code {code}" + (f": {lines[-1].strip()}" if lines else "")
