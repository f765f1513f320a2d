"""A model's parallel layout and how its ranks are launched (``source: megatron`` only).

    models:
      megatron_tp2_pp2:
        source: megatron
        tensor_parallel: 2
        pipeline_parallel: 2
        launch: {nproc: 4}          # optional; timeout: seconds for the whole run
      megatron_mixtral_ep2:
        source: megatron
        preset: mixtral
        expert_parallel: 2          # each rank holds half the experts
      megatron_dp2:
        source: megatron
        data_parallel: 2            # 2 replicas, each trains on its half of every step's batch

A model with ``tensor_parallel``, ``pipeline_parallel`` or ``data_parallel`` > 1, or with
``launch:``, runs on real ranks under torchrun (``run/launch.py``); ``nproc`` must equal
``tensor_parallel x pipeline_parallel x expert_parallel x data_parallel``. Without
``data_parallel`` every rank holds a different part of the model (the expert-parallel ranks
run the same batch); ``data_parallel`` replicas split each step's batch, as megatron-core's data
parallelism does (training with megatron-core's own stack and its distributed optimizer only).
Without ``launch:`` the ranks are launched all the same, ``nproc`` being that product.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..yaml_reader import Reader

LAUNCH_KEYS = ("nproc", "timeout")
DEFAULT_TIMEOUT = 600.0  # seconds for all ranks together; a stuck collective must not hang pytest


def parse_parallel(reader: Reader) -> dict[str, Any]:
    """``tensor_parallel``, ``pipeline_parallel`` and ``launch`` of a megatron model, checked
    together: the options they add to the model spec."""
    tp = reader.get_int("tensor_parallel", 1, minimum=1)
    pp = reader.get_int("pipeline_parallel", 1, minimum=1)
    ep = reader.get_int("expert_parallel", 1, minimum=1)
    dp = reader.get_int("data_parallel", 1, minimum=1)
    if dp > 1 and ep > 1:
        reader.fail("data_parallel runs at expert_parallel 1 (allowed: 1)", "data_parallel")
    sub = reader.get_mapping("launch")
    out: dict[str, Any] = {}
    sizes = (
        ("tensor_parallel", tp),
        ("pipeline_parallel", pp),
        ("expert_parallel", ep),
        ("data_parallel", dp),
    )
    for key, value in sizes:
        if reader.has(key):
            out[key] = value
    if sub is None:
        return out
    sub.check_keys(LAUNCH_KEYS)
    nproc = sub.get_int("nproc", minimum=1)
    if nproc is None:
        sub.fail(
            f"missing required key 'nproc' (the number of ranks: {_product(tp, pp, ep, dp)} = {tp * pp * ep * dp})"
        )
    if nproc != tp * pp * ep * dp:
        sub.fail(
            f"{nproc} ranks cannot hold {_product(tp, pp, ep, dp)}: nproc must be {tp * pp * ep * dp} "
            "(more replicas: data_parallel)",
            "nproc",
        )
    timeout = sub.get_float("timeout", DEFAULT_TIMEOUT, non_negative=True)
    if timeout <= 0:
        sub.fail(f"must be > 0 seconds, got {timeout}", "timeout")
    sub.done()
    out["launch"] = {"nproc": nproc, "timeout": timeout}
    return out


def _product(tp: int, pp: int, ep: int, dp: int = 1) -> str:
    return (
        f"tensor_parallel {tp} x pipeline_parallel {pp}"
        + (f" x expert_parallel {ep}" if ep > 1 else "")
        + (f" x data_parallel {dp}" if dp > 1 else "")
    )


def world_size(options: Mapping[str, Any]) -> int:
    """How many ranks a model runs on (1: in this process)."""
    keys = ("tensor_parallel", "pipeline_parallel", "expert_parallel", "data_parallel")
    sizes = (options.get(k, 1) for k in keys)
    out = 1
    for size in sizes:
        out *= int(size)
    return out


def launched(options: Mapping[str, Any]) -> bool:
    """Whether a model runs on ranks under torchrun rather than in this process."""
    return world_size(options) > 1 or "launch" in options


def launch_timeout(options: Mapping[str, Any]) -> float:
    launch = options.get("launch") or {}
    return float(launch.get("timeout", DEFAULT_TIMEOUT))
