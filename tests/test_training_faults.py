"""The optimizer the training-mutation benchmark plants (benchmarks/training_faults.py's
``AdamWVariant``) is torch's AdamW to the bit but for the one thing each mutation changes:
the bias correction, the step counter, from the step it starts at."""

from __future__ import annotations

import importlib.util
import math
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.helpers.paths import REPO


def _faults() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "training_faults", REPO / "benchmarks" / "training_faults.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SETTINGS = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}


def _trajectory(make: type[torch.optim.Optimizer], steps: int = 5, **variant: object) -> list[torch.Tensor]:
    """The parameter after each of ``steps`` updates on fixed grads."""
    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(6, 4, generator=generator))
    optimizer = make([param], **SETTINGS, **variant)  # type: ignore[call-arg]
    out = []
    for _ in range(steps):
        param.grad = torch.randn(6, 4, generator=generator) * 1e-3
        optimizer.step()
        out.append(param.detach().clone())
    return out


def test_the_variant_without_changes_is_torchs_adamw_to_the_bit() -> None:
    mine = _trajectory(_faults().AdamWVariant)
    torch_adamw = _trajectory(torch.optim.AdamW)
    assert all(torch.equal(a, b) for a, b in zip(mine, torch_adamw, strict=True))


def test_bias_correction_off_is_adams_update_without_it() -> None:
    generator = torch.Generator().manual_seed(0)
    before = torch.randn(6, 4, generator=generator)
    grad = torch.randn(6, 4, generator=generator) * 1e-3
    after = _trajectory(_faults().AdamWVariant, steps=1, bias_correction=False)[0]
    lr, (b1, b2), eps, wd = SETTINGS["lr"], SETTINGS["betas"], SETTINGS["eps"], SETTINGS["weight_decay"]
    # m = (1 - b1) g, v = (1 - b2) g^2, neither divided by its bias correction
    expected = before * (1 - lr * wd) - lr * (1 - b1) * grad / (math.sqrt(1 - b2) * grad.abs() + eps)
    torch.testing.assert_close(after, expected)
    assert not torch.allclose(after, _trajectory(torch.optim.AdamW, steps=1)[0])


@pytest.mark.parametrize("variant", [{"bias_correction": False}, {"step_offset": 1}])
def test_a_variant_from_step_3_is_torchs_adamw_before_it(variant: dict[str, object]) -> None:
    mine = _trajectory(_faults().AdamWVariant, from_step=3, **variant)
    torch_adamw = _trajectory(torch.optim.AdamW)
    assert all(torch.equal(a, b) for a, b in zip(mine[:3], torch_adamw[:3], strict=True))
    assert not torch.allclose(mine[3], torch_adamw[3], rtol=1e-6, atol=0)


def test_a_step_counter_one_ahead_is_adamw_whose_count_started_at_1() -> None:
    mine = _trajectory(_faults().AdamWVariant, steps=3, step_offset=1)
    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(6, 4, generator=generator))
    torch_adamw = torch.optim.AdamW([param], **SETTINGS)  # type: ignore[arg-type]
    torch_adamw.state[param] = {  # its state as after one update that moved nothing
        "step": torch.tensor(1.0),
        "exp_avg": torch.zeros_like(param),
        "exp_avg_sq": torch.zeros_like(param),
    }
    for want in mine:
        param.grad = torch.randn(6, 4, generator=generator) * 1e-3
        torch_adamw.step()
        assert torch.equal(param.detach(), want)
    assert not torch.equal(mine[-1], _trajectory(torch.optim.AdamW, steps=3)[-1])


def test_decay_on_every_group_decays_the_no_decay_group_by_the_default() -> None:
    def stepped(make: Any, **variant: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        decayed, exempt = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
        start = exempt.detach().clone()
        groups = [{"params": [decayed]}, {"params": [exempt], "weight_decay": 0.0}]
        optimizer = make(groups, **SETTINGS, **variant)
        for p in (decayed, exempt):
            p.grad = torch.full_like(p, 1e-3)
        optimizer.step()
        return decayed.detach(), exempt.detach(), start

    mine, torch_adamw = stepped(_faults().AdamWVariant, decay_every_group=True), stepped(torch.optim.AdamW)
    assert torch.equal(mine[0], torch_adamw[0])  # the decayed group as torch decays it
    lr, wd = 1e-2, 0.1  # SETTINGS': the exempt group decayed by lr x wd of its value before the step
    torch.testing.assert_close(mine[1], torch_adamw[1] - lr * wd * torch_adamw[2])
