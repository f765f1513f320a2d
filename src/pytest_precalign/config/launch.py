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

A model with ``tensor_parallel`` or ``pipeline_parallel`` > 1, or with ``launch:``, runs on
real ranks under torchrun (``run/launch.py``); ``nproc`` must equal ``tensor_parallel x
pipeline_parallel x expert_parallel`` (no other data parallelism: every rank holds a different
part of the model; the expert-parallel ranks run the same batch).
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
    sub = reader.get_mapping("launch")
    out: dict[str, Any] = {}
    for key, value in (("tensor_parallel", tp), ("pipeline_parallel", pp), ("expert_parallel", ep)):
        if reader.has(key):
            out[key] = value
    if sub is None:
        return out
    sub.check_keys(LAUNCH_KEYS)
    nproc = sub.get_int("nproc", minimum=1)
    if nproc is None:
        sub.fail(
            f"missing required key 'nproc' (the number of ranks: {_product(tp, pp, ep)} = {tp * pp * ep})"
        )
    if nproc != tp * pp * ep:
        sub.fail(
            f"{nproc} ranks cannot hold {_product(tp, pp, ep)}: nproc must be {tp * pp * ep} "
            "(data parallelism is not supported)",
            "nproc",
        )
    timeout = sub.get_float("timeout", DEFAULT_TIMEOUT, non_negative=True)
    if timeout <= 0:
        sub.fail(f"must be > 0 seconds, got {timeout}", "timeout")
    sub.done()
    out["launch"] = {"nproc": nproc, "timeout": timeout}
    return out


def _product(tp: int, pp: int, ep: int) -> str:
    return f"tensor_parallel {tp} x pipeline_parallel {pp}" + (f" x expert_parallel {ep}" if ep > 1 else "")


def world_size(options: Mapping[str, Any]) -> int:
    """How many ranks a model runs on (1: in this process)."""
    sizes = (options.get(k, 1) for k in ("tensor_parallel", "pipeline_parallel", "expert_parallel"))
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
