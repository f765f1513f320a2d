"""megatron_cpu() covers megatron-core's training stack on a CPU-only torch: the real
DistributedDataParallel (grad buffers, main_grad), get_megatron_optimizer (FP32Optimizer;
Float16OptimizerWithFloat16Params with fp32 main params for bf16), clipping, finalize_model_grads
and OptimizerParamScheduler, on a tiny GPTModel (2 layers, hidden 32)."""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")
if torch.cuda.is_available():  # pragma: no cover - the patches are a no-op there
    pytest.skip("megatron_cpu() is a no-op where CUDA is available", allow_module_level=True)

from pytest_precalign import megatron_cpu  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

SEQ, VOCAB = 16, 128


def _model(dtype: torch.dtype) -> tuple[Any, TransformerConfig]:
    torch.manual_seed(0)
    warnings.simplefilter("ignore")  # megatron-core's deprecation notices (pytest restores filters)
    config = TransformerConfig(
        num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
        add_bias_linear=False, add_qkv_bias=True, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", hidden_dropout=0.0,
        attention_dropout=0.0, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16, calculate_per_token_loss=True,
    )  # fmt: skip
    model = GPTModel(
        config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=VOCAB,
        max_sequence_length=64, position_embedding_type="rope",
    ).to(dtype)  # fmt: skip
    return model, config


def _ddp(model: Any, config: TransformerConfig) -> Any:
    with megatron_cpu():
        ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp.no_sync
    return ddp


def _forward_backward(ddp: Any, tokens: torch.Tensor, micro_batches: int) -> list[dict[str, Any]]:
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]

    def forward_step(data_iterator: Any, model: Any) -> Any:
        t = next(data_iterator)
        positions = torch.arange(SEQ)[None].expand(t.shape[0], SEQ)
        out = model(input_ids=t[:, :-1], position_ids=positions, attention_mask=mask, labels=t[:, 1:])

        def loss_func(per_token: torch.Tensor) -> Any:
            total = per_token.float().sum()
            tokens = torch.tensor(per_token.numel(), dtype=torch.int)
            return total, tokens, {"lm loss": torch.stack([total.detach(), tokens.float()])}

        return out, loss_func

    with megatron_cpu(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_forward_backward_func()(  # type: ignore[no-any-return]
            forward_step_func=forward_step, data_iterator=iter(tokens.chunk(micro_batches)), model=[ddp],
            num_microbatches=micro_batches, seq_length=SEQ, micro_batch_size=tokens.shape[0] // micro_batches,
        )  # fmt: skip


def _optimizer(ddp: Any, **options: Any) -> Any:
    config = OptimizerConfig(optimizer="adam", lr=1e-2, min_lr=1e-3, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
                             adam_eps=1e-8, **options)  # fmt: skip
    with megatron_cpu(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_megatron_optimizer(config, [ddp])


def _params(ddp: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in ddp.module.named_parameters()}


def _constant_schedule(optimizer: Any) -> Any:
    """Megatron applies a group's wd_mult (0 for biases and 1-d params) only through the
    scheduler: without one, every group keeps OptimizerConfig.weight_decay."""
    return OptimizerParamScheduler(
        optimizer, init_lr=1e-2, max_lr=1e-2, min_lr=1e-2, lr_warmup_steps=0, lr_decay_steps=1,
        lr_decay_style="constant", start_wd=0.1, end_wd=0.1, wd_incr_steps=1, wd_incr_style="constant",
    )  # fmt: skip


def _tokens(seed: int, batch: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def _torch_adamw(
    before: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], lr: float
) -> dict[str, torch.Tensor]:
    """The same update by torch.optim.AdamW on copies: decay on matrices only (Megatron's default
    groups: no decay for biases and 1-d parameters)."""
    params = {n: p.clone().requires_grad_(True) for n, p in before.items()}
    for name, p in params.items():
        p.grad = grads[name].clone()
    decay = [p for n, p in params.items() if p.ndim > 1 and not n.endswith(".bias")]
    no_decay = [p for n, p in params.items() if not (p.ndim > 1 and not n.endswith(".bias"))]
    reference = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8,
    )  # fmt: skip
    reference.step()
    return {n: p.detach() for n, p in params.items()}


def test_fp32_optimizer_step_is_torch_adamw_on_the_same_grads(megatron_world: None) -> None:
    """FP32Optimizer behind get_megatron_optimizer, grads from the real DDP buffers (main_grad,
    averaged per token by finalize_model_grads): its update equals torch.optim.AdamW's bitwise."""
    model, config = _model(torch.float32)
    ddp = _ddp(model, config)
    optimizer = _optimizer(ddp, clip_grad=0.0)
    _constant_schedule(optimizer)
    assert [type(o).__name__ for o in optimizer.chained_optimizers] == ["FP32Optimizer"]
    ddp.zero_grad_buffer()
    losses = _forward_backward(ddp, _tokens(1), micro_batches=2)
    assert len(losses) == 2
    grads = {n: p.main_grad.detach().clone() for n, p in ddp.module.named_parameters()}
    expected = _torch_adamw(_params(ddp), grads, lr=1e-2)
    with megatron_cpu():
        ok, grad_norm, _ = optimizer.step()
    assert ok
    assert grad_norm == pytest.approx(
        math.sqrt(sum(float(g.double().square().sum()) for g in grads.values())), rel=1e-5
    )
    for name, param in ddp.module.named_parameters():
        torch.testing.assert_close(param.detach(), expected[name], rtol=0, atol=0, msg=name)


def test_clip_grad_scales_main_grads_by_megatrons_coefficient(megatron_world: None) -> None:
    """clip_grad 1e-3 on CPU: the global norm is Megatron's and the AdamW update is the one of the
    grads times clip / (norm + 1e-6)."""
    model, config = _model(torch.float32)
    ddp = _ddp(model, config)
    optimizer = _optimizer(ddp, clip_grad=1e-3)
    _constant_schedule(optimizer)
    ddp.zero_grad_buffer()
    _forward_backward(ddp, _tokens(2), micro_batches=1)
    grads = {n: p.main_grad.detach().clone() for n, p in ddp.module.named_parameters()}
    before = _params(ddp)
    with megatron_cpu():
        ok, grad_norm, _ = optimizer.step()
    coefficient = 1e-3 / (grad_norm + 1.0e-6)
    assert ok and coefficient < 1.0
    expected = _torch_adamw(before, {n: g * coefficient for n, g in grads.items()}, lr=1e-2)
    for name, param in ddp.module.named_parameters():
        assert torch.equal(param.main_grad, grads[name] * coefficient), name
        torch.testing.assert_close(param.detach(), expected[name], rtol=0, atol=0, msg=name)


def test_bf16_keeps_fp32_main_params_and_copies_them_back(megatron_world: None) -> None:
    """bf16: Float16OptimizerWithFloat16Params keeps fp32 main params, steps them with the fp32
    grads of the DDP buffer, and writes them back into the bf16 model params."""
    model, config = _model(torch.bfloat16)
    ddp = _ddp(model, config)
    optimizer = _optimizer(ddp, clip_grad=1.0, bf16=True, params_dtype=torch.bfloat16)
    (inner,) = optimizer.chained_optimizers
    assert type(inner).__name__ == "Float16OptimizerWithFloat16Params"
    mains = [p for group in inner.fp32_from_float16_groups for p in group]
    assert mains and all(p.dtype == torch.float32 for p in mains)
    before = [p.detach().clone() for p in mains]
    ddp.zero_grad_buffer()
    _forward_backward(ddp, _tokens(3), micro_batches=2)
    with megatron_cpu():
        ok, grad_norm, _ = optimizer.step()
    assert ok and grad_norm > 0
    moved = sum(not torch.equal(a, b) for a, b in zip(before, mains, strict=True))
    assert moved == len(mains)
    for model_group, main_group in zip(inner.float16_groups, inner.fp32_from_float16_groups, strict=True):
        for model_param, main_param in zip(model_group, main_group, strict=True):
            assert model_param.dtype == torch.bfloat16
            assert torch.equal(model_param.detach(), main_param.detach().to(torch.bfloat16))


def test_scheduler_sets_warmup_then_cosine_on_the_real_param_groups(megatron_world: None) -> None:
    """OptimizerParamScheduler on get_megatron_optimizer's groups: LR 0 at the first update, the
    warmup's ramp, half a cosine to min_lr at lr_decay_steps; wd only on the decayed group."""
    model, config = _model(torch.float32)
    optimizer = _optimizer(_ddp(model, config), clip_grad=1.0)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=1e-2, min_lr=1e-3, lr_warmup_steps=2, lr_decay_steps=10,
        lr_decay_style="cosine", start_wd=0.1, end_wd=0.1, wd_incr_steps=10, wd_incr_style="constant",
    )  # fmt: skip
    seen = []
    for _ in range(12):
        seen.append([g["lr"] for g in optimizer.param_groups])
        scheduler.step(1)
    assert all(len(set(lrs)) == 1 for lrs in seen)
    lrs = [lrs[0] for lrs in seen]
    expected = [0.0, 5e-3] + [1e-3 + 0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) * 9e-3 for s in range(2, 11)]
    assert lrs[:11] == pytest.approx(expected, rel=1e-12)
    assert lrs[11] == 1e-3
    assert sorted(g["weight_decay"] for g in optimizer.param_groups) == [0.0, 0.1]


def test_training_patches_are_scoped_and_restored() -> None:
    """Inside megatron_cpu(), the optimizer modules make their 'cuda' scalars on the CPU and a
    CPU tensor's type() names the CUDA type only when megatron.core.optimizer asks; after it,
    nothing is left (Tensor.type is torch's own again)."""
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as optimizer_module

    assert "type" not in vars(torch.Tensor)
    with megatron_cpu():
        assert clip_grads.torch.zeros(1, device="cuda").device.type == "cpu"
        assert optimizer_module.torch.tensor([1.0], device="cuda").device.type == "cpu"
        assert torch.zeros(1).type() == "torch.FloatTensor"  # asked from here: unchanged
        assert torch.zeros(1).type(torch.float64).dtype == torch.float64
        ask = eval("lambda t: t.type()", {"__name__": "megatron.core.optimizer.optimizer"})  # noqa: S307
        assert ask(torch.zeros(1, dtype=torch.bfloat16)) == "torch.cuda.BFloat16Tensor"
        with megatron_cpu():  # nested
            assert ask(torch.zeros(1)) == "torch.cuda.FloatTensor"
        assert ask(torch.zeros(1)) == "torch.cuda.FloatTensor"
    assert "type" not in vars(torch.Tensor)
    assert clip_grads.torch is torch and optimizer_module.torch is torch
    assert sys.modules["megatron.core.utils"].torch is torch
    with pytest.raises((AssertionError, RuntimeError)):
        optimizer_module.torch.tensor([1.0], device="cuda")


def test_distributed_optimizer_patches_are_scoped_and_restored() -> None:
    """The distributed optimizer's module makes its 'cuda' tensors on the CPU and sees CUDA
    type names inside megatron_cpu() only; nothing of it is left after."""
    import megatron.core.optimizer.distrib_optimizer as distrib

    ask = eval("lambda t: t.type()", {"__name__": "megatron.core.optimizer.distrib_optimizer"})  # noqa: S307
    assert ask(torch.zeros(1)) == "torch.FloatTensor"
    with megatron_cpu():
        assert distrib.torch.zeros(2, device="cuda").device.type == "cpu"
        assert ask(torch.zeros(1)) == "torch.cuda.FloatTensor"
    assert distrib.torch is torch and "type" not in vars(torch.Tensor)
    assert ask(torch.zeros(1)) == "torch.FloatTensor"


def _moe_router_grads(aux_loss_coeff: float) -> dict[str, torch.Tensor]:
    """One step of a tiny MoE GPTModel (4 experts, top-2, the local spec) through the schedule
    inside megatron_cpu(): the routers' weight grads."""
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    config = TransformerConfig(
        num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
        num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_aux_loss_coeff=aux_loss_coeff,
        moe_router_load_balancing_type="aux_loss", moe_token_dispatcher_type="allgather",
        add_bias_linear=False, normalization="RMSNorm", hidden_dropout=0.0, attention_dropout=0.0,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, use_cpu_initialization=True,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=False, normalization="RMSNorm")
    model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=64, position_embedding_type="rope")
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
    positions = torch.arange(SEQ)[None].expand(4, SEQ)

    def forward_step(data_iterator: Any, chunk: Any) -> Any:
        t = next(data_iterator)
        out = chunk(input_ids=t[:, :-1], position_ids=positions, attention_mask=mask, labels=t[:, 1:])
        return out, lambda per_token: (per_token.float().mean(), {})

    with megatron_cpu():
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter([_tokens(3)]), model=[model],
            num_microbatches=1, seq_length=SEQ, micro_batch_size=4,
        )  # fmt: skip
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if n.endswith("router.weight")}


def test_moe_aux_loss_trains_on_the_cpu_and_the_moe_patches_are_restored(megatron_world: None) -> None:
    """Patch 7: a MoE model trains with its aux load-balancing loss inside megatron_cpu() (the
    aux-loss tracker's 'cuda' zeros on the CPU, the router's gating without Transformer Engine),
    the aux loss reaches the routers' grads, and nothing of the patch is left after."""
    from megatron.core.transformer.moe import moe_utils

    had_te_gemm = hasattr(moe_utils, "te_general_gemm")
    with_aux, without_aux = _moe_router_grads(1e-2), _moe_router_grads(0.0)
    assert sorted(with_aux) == ["decoder.layers.0.mlp.router.weight", "decoder.layers.1.mlp.router.weight"]
    for name, grad in with_aux.items():
        assert bool(torch.isfinite(grad).all()) and float(grad.abs().sum()) > 0, name
        assert not torch.equal(grad, without_aux[name]), f"{name}: the aux loss did not reach its grad"
    assert moe_utils.torch is torch
    assert hasattr(moe_utils, "te_general_gemm") == had_te_gemm
