"""Records carry the model's own names and classes whatever wraps its pieces inside it:
``checkpoint_wrapper``'s ``_checkpoint_wrapped_module`` (and FSDP1's ``_fsdp_wrapped_module``, a
compiled submodule's ``_orig_mod``) segments are dropped and the wrappers themselves not recorded
(their forward is the inner module's), so a wrapped run's records pair one to one with a bare
run's; FSDP2's swapped ``FSDP<Class>`` classes are recorded as the class."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_precalign.recording import HookRecorder  # noqa: E402
from pytest_precalign.recording.module_names import class_name, clean  # noqa: E402


def net() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 8),
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()),
        torch.nn.Linear(8, 2),
    )


def records(model: Any) -> dict[str, Any]:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with HookRecorder(model, mode="stats") as rec:
        model(x).square().sum().backward()
        rec.record_params()
    return {r.id: (r.module_class, r.stats) for r in rec.trace().records}


def test_checkpointed_pieces_record_the_bare_models_names() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    bare = records(net())
    wrapped = net()
    wrapped[1] = checkpoint_wrapper(wrapped[1])
    wrapped[2] = checkpoint_wrapper(wrapped[2])
    names = [n for n, _ in wrapped.named_parameters()]
    assert any("_checkpoint_wrapped_module" in n for n in names)
    got = records(wrapped)
    assert sorted(got) == sorted(bare)
    for rid, (cls, stats) in bare.items():
        assert got[rid][0] == cls, rid
        assert got[rid][1] == stats, rid


def test_fsdp2_classes_and_wrapper_segments() -> None:
    assert (
        clean("model.layers.0._checkpoint_wrapped_module.mlp._orig_mod.up.weight")
        == "model.layers.0.mlp.up.weight"
    )
    assert clean("model._fsdp_wrapped_module.layers.0") == "model.layers.0"
    assert clean("model.layers.0") == "model.layers.0"

    class FSDPModule:  # FSDP2's swapped class: FSDP<Class>(FSDPModule, Class)
        pass

    swapped = type("FSDPLinear", (FSDPModule, torch.nn.Linear), {})
    module = torch.nn.Linear(2, 2)
    module.__class__ = swapped
    assert class_name(module) == "Linear"
    assert class_name(torch.nn.Linear(2, 2)) == "Linear"
