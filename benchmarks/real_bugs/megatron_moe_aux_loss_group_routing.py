"""With group-limited routing (``moe_router_num_groups``/``moe_router_group_topk``, DeepSeek-V3's
node/device-limited routing) or an expert bias, megatron-core's MoE auxiliary load-balancing
loss counted each expert's tokens from the *routed* map (after the group limit and the bias)
instead of the plain top-k of the router's scores: the aux loss, which never shows in the
loss value (``MoEAuxLossAutoScaler`` adds only its gradient), pushed the router with wrong
counts (Megatron Core 0.13.0 CHANGELOG, MoE bug fixes: "Fix the aux loss calculation when
expert_bias or group limited routing is used. This leads to load_balancing_loss values change
compared to the previous version."). The fix, in ``TopKRouter.aux_loss_load_balancing``
(megatron-core 0.12.3 -> 0.13.1)::

    -            scores = self.compute_routing_scores_for_aux_loss(logits)
    +            scores, loss_routing_map = self.compute_routing_scores_for_aux_loss(logits)
                 aux_loss_func = partial(
                     switch_load_balancing_loss_func,
                     probs=scores,
    -                tokens_per_expert=tokens_per_expert,
    +                tokens_per_expert=loss_routing_map.sum(dim=0),

(``compute_routing_scores_for_aux_loss`` now also returns the top-k map of the scores).

Releases: buggy megatron-core 0.12.3, fixed 0.13.1, each beside torch 2.13 on the CPU (inside
``megatron_cpu()``). User path: the user's own megatron-core loop (a tiny GPT with 8 experts,
top-2, aux loss 1e-2, the local spec, ``get_forward_backward_func``, AdamW) recorded with
``Recorder`` (stats). Weights come from a fixed seed per parameter name (the same on both
releases, whatever order a release makes its parameters in). Twin: the same run without the
group limit (plain top-2), where both releases count the same tokens."""

from __future__ import annotations

import os
import socket
import warnings
import zlib
from pathlib import Path

import torch
from _tiny import VOCAB, main, token_rows

from pytest_precalign import Recorder, megatron_cpu
from pytest_precalign.training.step_evidence import StepEvidence, group_settings

STEPS, BATCH, SEQ, LR = 3, 4, 16, 5e-3
AUX_LOSS_COEFF = 1e-2


def _init_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:  # a free port on loopback for the 1-rank gloo group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)


def _model(group_limited: bool) -> torch.nn.Module:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    groups = {"moe_router_num_groups": 4, "moe_router_group_topk": 1} if group_limited else {}
    config = TransformerConfig(
        num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
        num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32, moe_aux_loss_coeff=AUX_LOSS_COEFF,
        moe_router_load_balancing_type="aux_loss", moe_token_dispatcher_type="allgather", **groups,
        add_bias_linear=False, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        normalization="RMSNorm", hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, use_cpu_initialization=True, params_dtype=torch.float32,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec(num_experts=8, moe_grouped_gemm=False, normalization="RMSNorm")
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
    return model


def record(out: Path, side: str, trigger: bool) -> None:
    warnings.simplefilter("ignore")  # megatron-core's notices about apex, TE and deprecated defaults
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.pipeline_parallel import get_forward_backward_func

    _init_distributed()
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)
    with megatron_cpu():
        tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = _model(group_limited=trigger)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    rec = Recorder(out, mode="stats")
    rec.record_settings(
        model, optimizer, steps=STEPS, clip_grad=None, loss_normalisation="per_token_over_step"
    )
    rec.record_initial_params(model)
    evidence = StepEvidence(params)
    rows = torch.tensor([row[: SEQ + 1] for row in token_rows(STEPS * BATCH, low=SEQ + 1, high=SEQ + 1)])
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
    positions = torch.arange(SEQ)[None].expand(BATCH, SEQ)

    def forward_step(data_iterator, chunk):  # type: ignore[no-untyped-def]
        tokens = next(data_iterator)
        out = chunk(
            input_ids=tokens[:, :-1], position_ids=positions, attention_mask=mask, labels=tokens[:, 1:]
        )

        def loss_func(per_token_loss):  # type: ignore[no-untyped-def]
            loss = per_token_loss.float().mean()
            rec.record_output("loss", loss)
            return loss, {"loss": loss.detach().clone()}

        return out, loss_func

    for step in range(STEPS):
        tokens = rows[step * BATCH : (step + 1) * BATCH]
        rec.start(model)
        evidence.begin()
        with megatron_cpu():
            losses = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter([tokens]), model=[model],
                num_microbatches=1, seq_length=SEQ, micro_batch_size=BATCH,
            )  # fmt: skip
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


if __name__ == "__main__":
    main(record)
