"""After an exception in a recorded forward or backward, the model carries no hooks of ours
(module, parameter, global), the tensor hooks left on the old graph record nothing, and the
next recorded run of the same model records what a fresh run records."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn.modules import module as module_globals

from pytest_precalign.recording import HookRecorder
from pytest_precalign.run.case import check_modules

HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
)
GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def _qwen2(cfg: dict[str, Any]) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**cfg, attn_implementation="eager"))


def _hooks_left(model: torch.nn.Module) -> list[str]:
    left = [
        f"{name or 'model'}.{d}" for name, m in model.named_modules() for d in HOOK_DICTS if getattr(m, d)
    ]
    left += [
        f"{n}._post_accumulate_grad_hooks"
        for n, p in model.named_parameters()
        if p._post_accumulate_grad_hooks
    ]
    left += [g for g in GLOBAL_HOOKS if getattr(module_globals, g)]
    return left


def _ids() -> torch.Tensor:
    return torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(3))


def _recorded(model: torch.nn.Module) -> tuple[list[tuple[str, str, str]], torch.Tensor]:
    ids = _ids()
    model.zero_grad(set_to_none=True)
    with HookRecorder(model, mode="tensor") as rec:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    trace = rec.trace()
    return [(r.name, r.kind, r.slot) for r in trace.records], out.logits.detach()


class Boom(RuntimeError):
    pass


def test_module_raising_mid_forward_leaves_no_hooks(tiny_qwen2_config: dict[str, Any]) -> None:
    model = _qwen2(tiny_qwen2_config)
    expected, logits = _recorded(_qwen2(tiny_qwen2_config))
    mlp = model.model.layers[1].mlp
    original = mlp.forward

    def raising(*args: Any, **kwargs: Any) -> Any:
        raise Boom("mlp failed mid-forward")

    mlp.forward = raising
    ids = _ids()
    with pytest.raises(Boom), HookRecorder(model, mode="tensor") as rec:
        model(input_ids=ids, labels=ids)
    assert _hooks_left(model) == []
    assert any(r.name == "model.layers.0" for r in rec.trace().records)  # it did record up to there
    mlp.forward = original
    records, again = _recorded(model)
    assert records == expected
    assert torch.equal(again, logits)


def test_grad_hook_raising_in_backward_leaves_no_hooks(tiny_qwen2_config: dict[str, Any]) -> None:
    model = _qwen2(tiny_qwen2_config)
    expected, _ = _recorded(_qwen2(tiny_qwen2_config))
    ids = _ids()

    def bad_grad(grad: torch.Tensor) -> torch.Tensor:
        raise Boom("grad hook failed")

    def add_bad_grad(module: torch.nn.Module, args: Any, out: torch.Tensor) -> None:
        out.register_hook(bad_grad)

    handle = model.model.layers[0].register_forward_hook(add_bad_grad)
    with pytest.raises(Boom), HookRecorder(model, mode="stats") as rec:
        model(input_ids=ids, labels=ids).loss.backward()
    handle.remove()
    assert _hooks_left(model) == []
    assert any(r.kind == "grad_output" for r in rec.trace().records)  # backward had started
    records, _ = _recorded(model)
    assert records == expected


def test_tensor_hooks_on_an_old_graph_record_nothing(tiny_qwen2_config: dict[str, Any]) -> None:
    """A backward through a graph built while recording, run after the recorder closed
    (e.g. after an exception), fires our tensor hooks, which must record nothing."""
    model = _qwen2(tiny_qwen2_config)
    ids = _ids()
    with HookRecorder(model, mode="stats") as rec:
        loss = model(input_ids=ids, labels=ids).loss
    count = len(rec.trace().records)
    loss.backward()
    assert len(rec.trace().records) == count
    assert all(p.grad is not None for p in model.parameters())


def test_runner_propagates_the_error_and_cleans_up() -> None:
    class Fails(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            if input.shape[0] > 1:
                raise Boom("bad batch")
            return self.lin(input)

    torch.manual_seed(0)
    base, cand = Fails(), Fails()
    with pytest.raises(Boom):
        check_modules(base, cand, {"input": torch.randn(2, 4)}, phases=("forward", "backward"))
    assert _hooks_left(base) == [] and _hooks_left(cand) == []
    run = check_modules(
        base, cand, {"input": torch.randn(1, 4)}, phases=("forward", "backward"), sync_weights_first=True
    )
    assert run.verdicts["forward"].passed and run.verdicts["backward"].passed
    assert {r.kind for r in run.baseline.records} >= {"activation", "grad_output", "param_grad"}
