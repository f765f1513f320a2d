"""Tiny models that modify a module's output or input in place (3-d inputs, so that
``nn.Linear``'s output is a view), each beside the same model written out of place."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class _Seeded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)


class AddAfter(_Seeded):
    """``h = block(x); h.add_(x)`` between two modules."""

    inplace = True

    def __init__(self) -> None:
        super().__init__()
        self.block, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(x)
        h = h.add_(x) if self.inplace else h + x
        out: torch.Tensor = self.head(h)
        return out


class AddAfterPlain(AddAfter):
    inplace = False


class ReluInplace(_Seeded):
    """``nn.ReLU(inplace=True)`` after a Linear."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        self.fc, self.act, self.head = nn.Linear(4, 4), nn.ReLU(inplace=inplace), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.act(self.fc(x)))
        return out


class ReluPlain(ReluInplace):
    def __init__(self) -> None:
        super().__init__(inplace=False)


class Scale(nn.Module):
    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2.0) if self.inplace else x * 2.0


class MulInput(_Seeded):
    """``x.mul_()`` on a module's input, inside the next module."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        self.fc, self.scale, self.head = nn.Linear(4, 4), Scale(inplace), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.scale(self.fc(x)))
        return out


class MulInputPlain(MulInput):
    def __init__(self) -> None:
        super().__init__(inplace=False)


class _LeakyGradRelu(torch.autograd.Function):
    """An in-place ReLU whose backward lets a tenth of the grad through where x < 0: a bug
    only the grads show."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(x)
        x.relu_()
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        return torch.where(out > 0, grad, grad * 0.1)


class _BadRelu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _LeakyGradRelu.apply(x)
        return out


class BadReluInplace(ReluInplace):
    def __init__(self) -> None:
        super().__init__()
        self.act = _BadRelu()


class ToReal(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(torch.complex(x, 2 * x))  # a float view of a complex base


class RealViewScaled(_Seeded):
    """A float view of a complex tensor scaled in place: its grad cannot be read out of the
    complex base's grad, so it is not recordable (with the reason)."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        self.inplace = inplace
        self.fc, self.to_real, self.head = nn.Linear(4, 4), ToReal(), nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.to_real(self.fc(x))
        r = r.mul_(3.0) if self.inplace else r * 3.0
        out: torch.Tensor = self.head(r)
        return out


INPLACE_NETS: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    "add_after": (AddAfter, AddAfterPlain),
    "relu_inplace": (ReluInplace, ReluPlain),
    "mul_input": (MulInput, MulInputPlain),
}

# The grads that vanished before (the model's own input does not require grad).
VANISHED = {
    "add_after": {("block", "grad_output")},
    "relu_inplace": {("fc", "grad_output"), ("act", "grad_input")},
    "mul_input": {("fc", "grad_output"), ("scale", "grad_input")},
}
