"""steps/torch_norms.py: the total norm and the clipping by hand (torch 2.4/2.5, which have no
``get_total_norm`` / ``clip_grads_with_norm_``) are bit for bit torch's own, here checked
against the public functions of the installed torch. The by-hand path running under a real
torch 2.4.1 is ``benchmarks/real_bugs/sdpa_fully_masked_rows_nan.py`` (its buggy release)."""

from __future__ import annotations

import torch

from pytest_precalign.steps.torch_norms import (
    clip_with_norm,
    clip_with_norm_by_hand,
    total_norm,
    total_norm_by_hand,
)


def _params() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5,), (4, 4, 2), (1,)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    params.append(torch.nn.Parameter(torch.randn(3, 3, generator=gen, dtype=torch.float64)))
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype) * 3
    return params


def test_total_norm_by_hand_is_torchs_bit_for_bit() -> None:
    grads = [p.grad for p in _params() if p.grad is not None]
    expected = torch.nn.utils.get_total_norm(grads, 2.0)
    assert torch.equal(total_norm_by_hand(grads, 2.0), expected)
    assert torch.equal(total_norm(grads, 2.0), expected)
    assert torch.equal(total_norm_by_hand(grads, 1.0), torch.nn.utils.get_total_norm(grads, 1.0))
    assert float(total_norm_by_hand([])) == 0.0


def test_clipping_by_hand_is_clip_grad_norm_bit_for_bit() -> None:
    mine, theirs, public = _params(), _params(), _params()
    grads = [p.grad for p in mine if p.grad is not None]
    norm = total_norm_by_hand(grads)
    returned = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert torch.equal(norm, returned)
    clip_with_norm_by_hand(mine, 1.0, norm)
    clip_with_norm(public, 1.0, norm)
    for a, b, c in zip(mine, theirs, public, strict=True):
        assert a.grad is not None and b.grad is not None and c.grad is not None
        assert torch.equal(a.grad, b.grad) and torch.equal(c.grad, b.grad)
    assert abs(float(total_norm([p.grad for p in mine if p.grad is not None])) - 1.0) < 1e-5  # clipped to 1
