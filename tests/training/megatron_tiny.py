"""A tiny megatron-core GPTModel (2 layers, hidden 32, vocab 128) in one gloo process, for the
training-stack tests."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch

SEQ, VOCAB = 16, 128


def megatron_world() -> Iterator[None]:
    """torch.distributed (world size 1) and Megatron's model-parallel state, torn down after."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from pytest_precalign import megatron_cpu

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    ps.initialize_model_parallel(1, 1)
    with megatron_cpu():
        tensor_parallel.model_parallel_cuda_manual_seed(0)
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        if created:
            dist.destroy_process_group()


def tiny_gpt(
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    attention_dropout: float = 0.0,
    hidden_dropout: float = 0.0,
) -> Any:
    warnings.simplefilter(
        "ignore"
    )  # megatron-core's notices (apex, TE, deprecations); pytest restores filters
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
        add_bias_linear=False, add_qkv_bias=True, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", hidden_dropout=hidden_dropout,
        attention_dropout=attention_dropout, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16,
    )  # fmt: skip
    return GPTModel(
        config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=VOCAB,
        max_sequence_length=64, position_embedding_type="rope",
    ).to(dtype)  # fmt: skip


def logits_of(model: Any, batch: Any) -> torch.Tensor:
    """GPTModel's logits [b, s, vocab] for ``batch["input_ids"]`` (explicit causal mask)."""
    ids = batch["input_ids"]
    s = ids.shape[-1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    positions = torch.arange(s)[None].expand_as(ids)
    return model(input_ids=ids, position_ids=positions, attention_mask=mask)  # type: ignore[no-any-return]


def token_batches(steps: int, batch: int = 4, seed: int = 7) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (batch, SEQ), generator=generator)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def split(batch: dict[str, torch.Tensor], micro: int) -> list[dict[str, torch.Tensor]]:
    return [
        dict(zip(batch, parts, strict=True))
        for parts in zip(*(v.chunk(micro) for v in batch.values()), strict=True)
    ]
