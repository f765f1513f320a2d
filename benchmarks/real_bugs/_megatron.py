"""A user's own megatron-core MoE training loop recorded with ``pytest_precalign.Recorder``
(the shape of ``example_suites/distributed/train_megatron.py``), as the megatron-core cases
share it: one gloo rank, a tiny GPTModel of the local spec with 8 experts (top-2, aux loss),
``get_forward_backward_func`` inside ``megatron_cpu()``, AdamW, layers in stats mode, the run's
settings and each step's scalars recorded. Weights come from a seed per parameter name (the same
numbers under every release, whatever order a release makes its parameters in).

It runs under every megatron-core release the cases use (0.11 - 0.16): only APIs they share."""

from __future__ import annotations

import inspect
import os
import socket
import warnings
import zlib
from pathlib import Path
from typing import Any

import torch
from _tiny import VOCAB, token_rows

from pytest_precalign import Recorder, megatron_cpu
from pytest_precalign.steps.step_evidence import StepEvidence, group_settings

STEPS, BATCH, SEQ, LR = 3, 4, 16, 5e-3


def init_world() -> None:
    """torch.distributed (one gloo rank on loopback) and Megatron's model-parallel state (TP=PP=1)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if not dist.is_initialized():
        with socket.socket() as s:  # a free port on loopback
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)
    with megatron_cpu():
        tensor_parallel.model_parallel_cuda_manual_seed(0)


def moe_gpt(**options: Any) -> tuple[torch.nn.Module, Any]:
    """The GPTModel and its TransformerConfig; ``options`` go into the config."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    warnings.simplefilter("ignore")  # megatron-core's notices about apex, TE and deprecated defaults
    config = TransformerConfig(
        num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
        num_moe_experts=8, moe_router_topk=2, moe_router_load_balancing_type="aux_loss",
        moe_token_dispatcher_type="allgather", add_bias_linear=False, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", hidden_dropout=0.0,
        attention_dropout=0.0, bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, use_cpu_initialization=True,
        params_dtype=torch.float32, **options,
    )  # fmt: skip
    # 0.11's local spec takes no normalization: without apex it wraps torch's norm of the config's
    # kind (torch.nn.RMSNorm), as the later releases' spec does when told RMSNorm
    norm = (
        {"normalization": "RMSNorm"}
        if "normalization" in inspect.signature(get_gpt_layer_local_spec).parameters
        else {}
    )
    spec = get_gpt_layer_local_spec(num_experts=8, moe_grouped_gemm=False, **norm)
    model = GPTModel(
        config, spec, vocab_size=VOCAB, max_sequence_length=64, share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
    )  # fmt: skip
    with torch.no_grad():  # every weight from a seed of its own name; norms at 1
        for name, param in model.named_parameters():
            gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            if param.ndim == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    return model, config


def _wrap(model: torch.nn.Module, config: Any) -> Any:
    """Megatron's DistributedDataParallel (grads in ``main_grad`` buffers) and
    ``finalize_model_grads`` as the schedule's grad finaliser (it divides the grads by the step's
    tokens when ``config.calculate_per_token_loss``)."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    with megatron_cpu():
        ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp.no_sync
    return ddp


def train(out: Path, model: torch.nn.Module, config: Any, *, ddp: bool = False) -> None:
    """``STEPS`` steps of one micro-batch of ``BATCH`` rows. ``ddp``: through Megatron's DDP and
    ``finalize_model_grads``, the optimizer stepping on the main grads (as FP32Optimizer does)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    chunk = _wrap(model, config) if ddp else model
    per_token = bool(getattr(config, "calculate_per_token_loss", False))
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    rec = Recorder(out, mode="stats")
    rec.record_settings(
        model, optimizer, steps=STEPS, clip_grad=None, loss_normalisation="per_token_over_step"
    )
    rec.record_initial_params(model)
    evidence = StepEvidence(params)
    rows = torch.tensor(token_rows(STEPS * BATCH, low=SEQ + 1, high=SEQ + 1))
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
    positions = torch.arange(SEQ)[None].expand(BATCH, SEQ)

    def forward_step(data_iterator: Any, module: Any) -> Any:
        tokens = next(data_iterator)
        out = module(
            input_ids=tokens[:, :-1], position_ids=positions, attention_mask=mask, labels=tokens[:, 1:]
        )

        def loss_func(per_token_loss: torch.Tensor) -> Any:
            mean = per_token_loss.float().mean()
            rec.record_output("loss", mean)
            if per_token:  # the sum and its tokens: finalize_model_grads divides by the tokens
                total = per_token_loss.float().sum()
                return total, torch.tensor(per_token_loss.numel(), dtype=torch.int), {"loss": mean.detach()}
            return mean, {"loss": mean.detach().clone()}

        return out, loss_func

    for step in range(STEPS):
        rec.start(model)
        evidence.begin()
        if ddp:
            chunk.zero_grad_buffer()
        with megatron_cpu():
            losses = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter([rows[step * BATCH : (step + 1) * BATCH]]),
                model=[chunk], num_microbatches=1, seq_length=SEQ, micro_batch_size=BATCH,
            )  # fmt: skip
        if ddp:
            for p in params:
                p.grad = p.main_grad.detach().clone()
        evidence.grads_before_clip()
        lr, wd = group_settings(optimizer)
        optimizer.step()
        optimizer.zero_grad()
        rec.record_scalars(
            evidence.finish(step, loss=float(losses[0]["loss"]), lr=lr, weight_decay=wd, micro_batches=1)
        )
        rec.stop()
        rec.step()
    rec.close()
