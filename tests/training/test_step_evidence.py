"""StepEvidence: what one optimizer step did, measured on a real model and torch optimizer."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_precalign.errors import RecorderError
from pytest_precalign.steps.step_evidence import (
    StepEvidence,
    batch_hash,
    group_settings,
    initial_params,
    token_count,
)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False))


def _grads(model: torch.nn.Module) -> None:
    x = torch.arange(8.0).reshape(2, 4)
    model(x).pow(2).sum().backward()


def test_grad_norm_is_the_pre_clip_norm_and_the_clip_coefficient_is_measured() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    evidence = StepEvidence(model.parameters())
    evidence.begin()
    _grads(model)
    model[0].bias.grad[0] = 0.0  # one exact zero
    before = evidence.grads_before_clip()
    returned = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    coef = evidence.grads_after_clip()
    lr, wd = group_settings(optimizer)
    snapshot = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    scalars = evidence.finish(3, loss=2.5, lr=lr, weight_decay=wd, tokens=7)
    assert before == float(returned)  # bitwise the number clip_grad_norm_ returns
    assert scalars.grad_norm == before and before > 1.0
    assert math.isclose(coef, 1.0 / before, rel_tol=1e-5)
    assert scalars.zero_grads == 1
    delta = torch.cat([(p.detach() - s).flatten() for p, s in zip(model.parameters(), snapshot, strict=True)])
    assert math.isclose(scalars.update_norm or 0.0, float(delta.norm()), rel_tol=1e-6)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert math.isclose(scalars.param_norm or 0.0, float(params.norm()), rel_tol=1e-6)
    assert scalars.step == 3 and scalars.lr == (0.1,) and scalars.weight_decay == (0.0,)
    assert scalars.loss == 2.5 and scalars.tokens == 7


def test_unclipped_step_has_coefficient_one_and_evidence_reads_only() -> None:
    model = _model()
    evidence = StepEvidence(model.parameters())
    evidence.begin()
    _grads(model)
    grads = [p.grad.clone() for p in model.parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    evidence.grads_before_clip()
    scalars = evidence.finish(0)
    assert scalars.clip_coef == 1.0 and scalars.update_norm == 0.0
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), params, strict=True))


def test_batch_hash_and_tokens_follow_ids_and_labels() -> None:
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    labels = ids.clone()
    labels[0, 0] = -100
    whole = [{"input_ids": ids, "labels": labels}]
    split = [{"input_ids": ids[:1], "labels": labels[:1]}, {"input_ids": ids[1:], "labels": labels[1:]}]
    assert token_count(whole) == token_count(split) == 5
    assert batch_hash(whole) == batch_hash(split)  # however the step is split into micro-batches
    assert batch_hash(whole) == batch_hash([{"input_ids": ids, "labels": labels, "mask": 1}])
    assert batch_hash(whole) != batch_hash([{"input_ids": ids, "labels": ids}])
    assert token_count([{"input_ids": ids}]) == 6


def test_initial_params_summarise_each_parameter() -> None:
    summary = initial_params([("w", torch.tensor([[3.0, -4.0]]))])
    assert summary == {"w": {"max": 3.0, "min": -4.0, "mean": -0.5, "norm": 5.0}}


def test_group_settings_per_group_in_order() -> None:
    model = _model()
    optimizer = torch.optim.AdamW(
        [
            {"params": model[0].parameters(), "weight_decay": 0.1},
            {"params": model[1].parameters(), "weight_decay": 0.0},
        ],
        lr=1e-3,
    )
    assert group_settings(optimizer) == ((1e-3, 1e-3), (0.1, 0.0))


def _zero_count_reads(
    evidence: StepEvidence, model: torch.nn.Module, zeros_after_clip: bool
) -> tuple[int, list[str]]:
    """(zero grads, the phase of each read of a grad's zeros by the C kernels) of one clipped
    step whose pre-clip norm the framework reported."""
    from pytest_precalign.recording import native_kernels

    phase, reads = ["before_clip"], list[str]()
    counted = native_kernels.zeros

    def counting(t: torch.Tensor) -> int | None:
        reads.append(phase[0])
        return counted(t)

    evidence.begin()
    _grads(model)
    model[0].bias.grad[0] = 0.0
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()], 2.0)
    native_kernels.zeros = counting  # type: ignore[assignment]
    try:
        evidence.grads_before_clip(norm=float(norm), zeros_after_clip=zeros_after_clip)
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), 0.5, norm)
        phase[0] = "after_clip"
        evidence.grads_after_clip()
        phase[0] = "finish"
        scalars = evidence.finish(0)
    finally:
        native_kernels.zeros = counted  # type: ignore[assignment]
    assert scalars.zero_grads is not None
    return scalars.zero_grads, reads


def test_zeros_after_clip_are_counted_in_the_clipped_norms_read_and_are_the_same_zeros() -> None:
    model = _model()
    zeros, reads = _zero_count_reads(StepEvidence(model.parameters()), model, zeros_after_clip=False)
    assert zeros == 1 and reads == ["before_clip"] * 3  # a pass of its own, before clipping
    model.zero_grad(set_to_none=True)
    zeros, reads = _zero_count_reads(StepEvidence(model.parameters()), model, zeros_after_clip=True)
    assert zeros == 1 and reads == ["after_clip"] * 3  # in grads_after_clip's read of each grad


def test_zeros_left_for_a_clipping_that_never_came_are_counted_at_finish() -> None:
    model = _model()
    evidence = StepEvidence(model.parameters())
    evidence.begin()
    _grads(model)
    model[1].weight.grad[0, 0] = 0.0
    evidence.grads_before_clip(norm=1.0, zeros_after_clip=True)  # a skipped update: no clipping
    assert evidence.finish(0).zero_grads == 1


def test_a_sparse_grad_is_measured_as_the_dense_grad_it_stands_for() -> None:
    """``Embedding(sparse=True)``: torch's norms (``clip_grad_norm_`` too) take no sparse grad;
    the step's evidence is the dense run's, bit for bit, and nothing of the run is changed."""
    measured = {}
    for sparse in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=sparse), torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        evidence = StepEvidence(model.parameters())
        evidence.begin()
        model(torch.tensor([[1, 2, 3]])).sum().backward()  # no index twice: the same additions
        grad = model[0].weight.grad
        assert grad is not None and grad.is_sparse == sparse
        evidence.grads_before_clip()
        opt.step()
        scalars = evidence.finish(0, loss=1.0)
        assert model[0].weight.grad is grad  # the user's grad left as it was
        measured[sparse] = (scalars.grad_norm, scalars.zero_grads, scalars.update_norm, scalars.param_norm)
    assert measured[True] == measured[False]
    assert measured[True][1] == 7 * 4  # the rows no index touched: zeros of the dense grad


def test_a_clip_coefficient_asked_before_the_norm_is_a_recorder_error() -> None:
    """Out of order (after clipping, before the norm was taken): the project's error, naming
    the call to make first, not a bare ``RuntimeError``."""
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    evidence = StepEvidence([param])
    evidence.begin()
    with pytest.raises(RecorderError, match=r"call grads_before_clip before the framework clips"):
        evidence.grads_after_clip()
