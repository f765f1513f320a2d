"""``param_and_update_norms``: the parameter and update norms of a step taken parameter by
parameter on the CPU (each read once while in cache), bit for bit ``get_total_norm``'s over
the three sweeps it replaces, whatever the mix of dtypes (torch groups them by dtype)."""

from __future__ import annotations

import torch

from pytest_precalign.training.step_norms import grad_norm_and_zeros, param_and_update_norms


def _params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(300, 70, generator=g),
        torch.randn(1000, generator=g).bfloat16(),
        torch.randn(33, generator=g, dtype=torch.float64),
        torch.randn(5, 5, generator=g) * 1e3,
        torch.randn(64, generator=g).half(),
        torch.randn(1, generator=g),
    ]


def test_equal_bitwise_to_the_three_sweeps_with_mixed_dtypes() -> None:
    after = _params()
    before = [
        p + torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(p.dtype) * 1e-3 for p in after
    ]
    expected_param = torch.nn.utils.get_total_norm(after, 2.0)
    expected_update = torch.nn.utils.get_total_norm(torch._foreach_sub(before, after), 2.0)
    snapshot = [b.clone() for b in before]
    param, update = param_and_update_norms(after, snapshot)
    assert update is not None
    assert param.item() == expected_param.item() and update.item() == expected_update.item() > 0
    assert all(torch.equal(s, b - a) for s, b, a in zip(snapshot, before, after, strict=True))


def test_without_a_snapshot_the_parameter_norm_only() -> None:
    after = _params()
    param, update = param_and_update_norms(after, None)
    assert update is None and param.item() == torch.nn.utils.get_total_norm(after, 2.0).item()


def test_grad_norm_and_zeros_bitwise_the_two_reads_in_one_host_sync() -> None:
    from pytest_precalign.recording.host_sync import host_syncs
    from pytest_precalign.training.step_evidence import grad_norm, zero_count

    grads = _params()
    for g in grads:
        g.view(-1)[::3] = 0.0
    expected = (grad_norm(grads), zero_count(grads))
    before = host_syncs()
    got = grad_norm_and_zeros(grads)
    assert host_syncs() - before == 1
    assert got == expected and got[1] > 0
    assert grad_norm_and_zeros([]) == (0.0, 0)
