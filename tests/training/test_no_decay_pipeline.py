"""``no_decay`` globs are written in the model's global names: on a pipeline stage whose local
layer numbering starts at 0, ``*.layers.1.*`` must still pick the model's second layer, in
megatron-core's param groups and in the launched loop's groups alike."""

from __future__ import annotations

import pytest

from pytest_precalign.megatron_core.megatron_stack import build_megatron_stack
from pytest_precalign.parallel.merge import globalize
from pytest_precalign.steps.spec import OptimizerSpec

from .megatron_tiny import tiny_gpt

SPEC = OptimizerSpec(lr=1e-3, weight_decay=0.1, no_decay=("*.layers.1.*",))


def _second_stage(model: object) -> dict[str, int]:
    """This model as the second of two stages of a 3-layer model: its layers are global 1, 2."""
    for layer in model.decoder.layers:  # type: ignore[attr-defined]
        layer.layer_number += 1  # Megatron numbers a stage's layers globally (1-based)
    return {"decoder.layers": 1}


def test_megatron_groups_match_globs_in_global_names_on_a_later_stage(megatron_world: None) -> None:
    model = tiny_gpt()
    offsets = _second_stage(model)
    stack = build_megatron_stack([model], SPEC, 2, 4, names=lambda _, n: globalize(n, offsets))
    exempt = {id(p) for g in stack.optimizer.param_groups if g["wd_mult"] == 0.0 for p in g["params"]}
    local = {n for n, p in model.named_parameters() if id(p) in exempt}
    assert local and all(n.startswith("decoder.layers.0.") for n in local)
    assert len(local) == sum(1 for n, _ in model.named_parameters() if n.startswith("decoder.layers.0."))
    decayed, plain = stack.plan(2).groups
    assert all(n.startswith("decoder.layers.1.") for n in plain)
    assert not any(n.startswith("decoder.layers.1.") for n in decayed)


def test_the_launched_loop_groups_match_globs_in_global_names(megatron_world: None) -> None:
    from pytest_precalign.run.trainers.loop_ranks import stage_param_groups

    model = tiny_gpt()
    _second_stage(model)
    groups = stage_param_groups(model, SPEC)
    decayed, plain = groups
    assert plain[2] == 0.0 and plain[0] and all(n.startswith("decoder.layers.1.") for n in plain[0])
    assert not any(n.startswith("decoder.layers.1.") for n in decayed[0])
    assert {id(p) for p in plain[1]} == {
        id(p) for n, p in model.named_parameters() if n.startswith("decoder.layers.0.")
    }


pytest.importorskip("megatron.core")
