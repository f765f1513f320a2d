from __future__ import annotations

import pytest
import torch

from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.tensor_summary import tensor_crc32, tensor_stats


def _qwen2(cfg: dict[str, int | bool], attn: str = "eager") -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**cfg, attn_implementation=attn))


def _run(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().clone(), grads


def _no_hooks(model: torch.nn.Module) -> bool:
    return not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules()
    ) and not any(p._post_accumulate_grad_hooks for p in model.parameters())


@pytest.mark.parametrize("mode", ["stats", "tensor", "hash"])
def test_recording_does_not_change_numerics(tiny_qwen2_config, mode):
    model = _qwen2(tiny_qwen2_config)
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1))
    logits_plain, grads_plain = _run(model, ids)
    with HookRecorder(model, mode=mode) as rec:
        logits_rec, grads_rec = _run(model, ids)
    assert torch.equal(logits_plain, logits_rec)
    assert grads_plain.keys() == grads_rec.keys()
    for name in grads_plain:
        assert torch.equal(grads_plain[name], grads_rec[name]), name
    trace = rec.trace()
    kinds = {r.kind for r in trace.records}
    assert {"input", "activation", "grad_output", "grad_input", "param_grad"} <= kinds
    assert _no_hooks(model)


def test_records_every_module_in_execution_order(tiny_qwen2_config):
    model = _qwen2(tiny_qwen2_config)
    ids = torch.randint(0, 1000, (1, 8))
    with HookRecorder(model, mode="stats") as rec:
        model(input_ids=ids, labels=ids).loss.backward()
    trace = rec.trace()
    acts = [r.name for r in trace.records if r.kind == "activation"]
    # post-hooks fire when a module returns: children before parents, layer 0 before layer 1
    assert acts.index("model.layers.0.mlp.down_proj") < acts.index("model.layers.0.mlp")
    assert acts.index("model.layers.0") < acts.index("model.layers.1.self_attn.q_proj")
    assert acts[-1] == "lm_head"
    # backward runs the other way round
    grads = [r.name for r in trace.records if r.kind == "grad_output"]
    assert grads.index("lm_head") < grads.index("model.layers.1.mlp") < grads.index("model.layers.0.mlp")
    param_grads = [r.name for r in trace.records if r.kind == "param_grad"]
    assert set(param_grads) == {n for n, _ in model.named_parameters()}
    seqs = [r.seq for r in trace.records]
    assert seqs == sorted(seqs) == list(range(len(seqs)))


def test_hooks_removed_when_forward_raises():
    class Boom(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Boom())
    with pytest.raises(RuntimeError, match="boom"), HookRecorder(model):
        model(torch.randn(2, 4))
    assert _no_hooks(model)


def test_hooks_removed_when_backward_raises():
    class BadGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("bad backward")

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return BadGrad.apply(self.lin(x))

    model = torch.nn.Sequential(Layer(), torch.nn.Linear(4, 1))
    with pytest.raises(RuntimeError, match="bad backward"), HookRecorder(model):
        model(torch.randn(2, 4)).sum().backward()
    assert _no_hooks(model)


def test_repeated_calls_get_call_indices():
    lin = torch.nn.Linear(4, 4)

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(self.lin(x))

    model = Twice()
    with HookRecorder(model, mode="tensor") as rec:
        model(torch.randn(3, 4, requires_grad=True)).sum().backward()
    trace = rec.trace()
    acts = [r for r in trace.records if r.kind == "activation" and r.name == "lin"]
    assert [r.call for r in acts] == [0, 1]
    grads = [r for r in trace.records if r.kind == "grad_output" and r.name == "lin"]
    assert sorted(r.call for r in grads) == [0, 1]
    assert not torch.equal(trace.tensor(acts[0]), trace.tensor(acts[1]))


def test_stats_mode_matches_tensor_values():
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    stats = tensor_stats(x)
    assert (stats.max, stats.min, stats.mean) == (4.0, -2.0, 1.5)
    assert stats.norm == pytest.approx(30**0.5)
    assert stats.nan == 0 and stats.inf == 0
    bad = tensor_stats(torch.tensor([1.0, float("nan"), float("inf"), float("-inf")]))
    assert (bad.nan, bad.inf) == (1, 2)
    ints = tensor_stats(torch.tensor([1, 2, 3]))
    assert (ints.max, ints.min, ints.mean) == (3.0, 1.0, 2.0)


def test_crc32_is_the_bytes_crc():
    import zlib

    x = torch.arange(6, dtype=torch.float32)
    assert tensor_crc32(x) == f"{zlib.crc32(x.numpy().tobytes()):08x}"
    assert tensor_crc32(x) != tensor_crc32(x + 1e-6)
    assert len(tensor_crc32(torch.zeros(0))) == 8


def test_identical_tensors_are_stored_once():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with HookRecorder(model, mode="tensor") as rec:
        model(torch.randn(2, 4))
    trace = rec.trace()
    out0 = next(r for r in trace.records if r.name == "0" and r.kind == "activation")
    in1 = next(r for r in trace.records if r.name == "1" and r.kind == "input")
    assert in1.tensor_key == out0.tensor_key
    assert len(trace.tensors) < len([r for r in trace.records if r.tensor_key])


def test_params_after_step_and_include_exclude():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with HookRecorder(model, mode="tensor", exclude=("1",)) as rec:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        rec.record_params()
    trace = rec.trace()
    assert "1" not in {r.name for r in trace.records}
    params = {r.name: trace.tensor(r) for r in trace.records if r.kind == "param"}
    assert set(params) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert torch.equal(params["2.bias"], model[2].bias.detach())


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="allowed: stats, tensor, hash"):
        HookRecorder(torch.nn.Linear(2, 2), mode="full")


def _embedding_net(sparse: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=sparse), torch.nn.Linear(4, 2))


@pytest.mark.parametrize("mode", ["stats", "hash", "tensor"])
def test_a_sparse_grad_is_recorded_as_the_dense_one_it_stands_for(mode: str) -> None:
    """``Embedding(sparse=True)`` gives its weight a sparse grad: recorded (torch's reductions
    do not take one) with the statistics, CRC and tensor of the dense grad a dense run records."""
    ids = torch.tensor([[1, 2, 3]])  # no index twice: the dense grad's additions are the same
    recorded = {}
    for sparse in (True, False):
        net = _embedding_net(sparse)
        with HookRecorder(net, mode=mode) as rec:
            net(ids).sum().backward()
        assert net[0].weight.grad is not None and net[0].weight.grad.is_sparse == sparse
        trace = rec.trace()
        (grad,) = [r for r in trace.records if r.name == "0.weight" and r.kind == "param_grad"]
        assert grad.shape == (10, 4) and grad.dtype == "float32"
        kept = trace.tensors[grad.tensor_key] if grad.tensor_key else None
        recorded[sparse] = (grad.stats, grad.crc32, None if kept is None else kept.tolist())
    assert recorded[True] == recorded[False]
    assert recorded[True][0] is not None or recorded[True][1] is not None


class _Cast(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


@pytest.mark.parametrize("mode", ["stats", "hash", "tensor"])
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_an_8_bit_float_is_summarised_as_the_float32_tensor_it_widens_to(
    dtype: torch.dtype, mode: str
) -> None:
    """torch's reductions take no float8 tensor (FP8 training casts to them): recording such an
    output raised; its statistics are now those of its exact float32 widening, a NaN or Inf
    counted as in any tensor."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    x[0, 0] = float("nan")
    for values in (x[1:], x):  # finite, then with a NaN
        net = torch.nn.Sequential(_Cast(dtype))
        with torch.no_grad(), HookRecorder(net, mode=mode) as rec:
            out = net(values)
        (record,) = [r for r in rec.trace().records if r.kind == "activation"]
        assert record.dtype == str(dtype).removeprefix("torch.")
        if mode == "hash":
            assert record.crc32 == tensor_crc32(out)
        elif torch.isfinite(out.float()).all():
            assert record.stats == tensor_stats(out.float())
        else:
            assert record.stats is not None and (record.stats.nan, record.stats.inf) == (1, 0)


class _Odd(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "meta":
            return torch.empty(2, 2, device="meta")
        return torch.nested.nested_tensor([x[0], x[1, :2]], layout=torch.jagged)


@pytest.mark.parametrize("mode", ["stats", "hash", "tensor"])
@pytest.mark.parametrize("kind", ["meta", "nested"])
def test_a_meta_or_nested_output_is_refused_in_one_message_naming_the_record(kind: str, mode: str) -> None:
    """torch's reductions raise an internal error on both ("NestedTensorImpl doesn't support
    sizes", "Cannot copy out of meta tensor"): the recorder says which record and what to do."""
    from pytest_precalign.errors import RecorderError

    net = torch.nn.Sequential(_Odd(kind))
    with pytest.raises(RecorderError) as raised, torch.no_grad(), HookRecorder(net, mode=mode):
        net(torch.randn(2, 4))
    what = "on the meta device" if kind == "meta" else "a nested tensor"
    assert str(raised.value).startswith(f"recorder: 0|activation|out|0|0 is {what}")
    assert "exclude=" in str(raised.value)
