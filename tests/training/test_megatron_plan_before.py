"""A megatron side's plan made before its stack is built (``plan_before_training``: megatron-core's
own ``_get_param_groups`` and ``OptimizerParamScheduler``) is the plan the built stack writes
into the manifest, with Megatron's default no-decay groups and with ``no_decay`` globs; and
making it leaves the model as it was (no DDP hooks, no ``main_grad``)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pytest_precalign.megatron_core.megatron_stack import build_megatron_stack, plan_before_training

from .megatron_tiny import tiny_gpt
from .test_megatron_stack import SPEC


@pytest.mark.parametrize("no_decay", [None, ("*layernorm*",)])
def test_the_plan_before_training_is_the_built_stacks(
    megatron_world: None, no_decay: tuple[str, ...] | None
) -> None:
    spec = replace(SPEC, no_decay=no_decay)
    model = tiny_gpt()
    before = plan_before_training([model], spec, 6, global_batch=4, micro_batches=2).as_dict()
    assert not any(hasattr(p, "main_grad") for p in model.parameters())  # no stack was built on it
    stack = build_megatron_stack([model], spec, 6, global_batch=4)
    built = stack.training_manifest(6, micro_batches=2).as_dict()
    for known_once_built in ("recorded_params", "optimizer_class"):
        del built["arguments"][known_once_built]
    assert json.loads(json.dumps(before)) == json.loads(json.dumps(built))
    plan = before["plan"]
    assert len(plan["groups"]) == 2 and plan["weight_decay"] == [0.1, 0.0]
    assert plan["lr"][0] == [0.0, 0.0] and plan["lr"][2] == [1e-2, 1e-2]  # warmup 2 from 0
