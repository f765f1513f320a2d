"""A user's own megatron-core training loop (tiny Qwen2.5, TP x PP over gloo), recorded by pytest-precalign.

python -m torch.distributed.run --nproc_per_node 4 train_megatron.py --tp 2 --pp 2 --steps 2 --out DIR
python -m torch.distributed.run --nproc_per_node 2 train_megatron.py --split-rows --steps 2 --out DIR  # DP=2
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torch.distributed as dist
from tiny_qwen import BATCH, CONFIG, LR, SEED, SEQ, batches, hf_weights, load_megatron_shard, megatron_weights

from pytest_precalign import Recorder, megatron_cpu

warnings.simplefilter("ignore")  # megatron-core's notices about apex, TE and deprecated defaults
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core import tensor_parallel  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--tp", type=int, default=1)
p.add_argument("--pp", type=int, default=1)
p.add_argument("--vpp", type=int, default=None, help="virtual pipeline: model chunks per stage")
p.add_argument("--recompute", action="store_true", help="full activation recomputation of every layer")
p.add_argument("--steps", type=int, default=2)
p.add_argument("--out", default=None, help="record into this folder (no recording without it)")
p.add_argument("--mode", default="tensor", help="stats | tensor | hash")
p.add_argument("--format", default="native", help="native (trace folders) | msprobe (msprobe's dump layout)")
p.add_argument("--fault", action="store_true", help="scale global layer 2's mlp output on one rank")
p.add_argument("--split-rows", action="store_true", help="each DP replica trains its share of the rows")
p.add_argument("--save", default=None, help="save this rank's last loss and params to SAVE.rank<R>.pt")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
ps.initialize_model_parallel(args.tp, args.pp, virtual_pipeline_model_parallel_size=args.vpp)
with megatron_cpu():
    tensor_parallel.model_parallel_cuda_manual_seed(SEED)
c = CONFIG
config = TransformerConfig(
    num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"], ffn_hidden_size=c["intermediate_size"],
    num_attention_heads=c["num_attention_heads"], num_query_groups=c["num_key_value_heads"],
    add_bias_linear=False, add_qkv_bias=True, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
    normalization="RMSNorm", layernorm_epsilon=c["rms_norm_eps"], hidden_dropout=0.0, attention_dropout=0.0,
    bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
    gradient_accumulation_fusion=False, use_cpu_initialization=True, params_dtype=torch.float32,
    tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp, pipeline_dtype=torch.float32,
    virtual_pipeline_model_parallel_size=args.vpp,
    **({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1} if args.recompute else {}),
)  # fmt: skip
model = [  # one chunk per virtual pipeline stage
    GPTModel(
        config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=c["vocab_size"],
        max_sequence_length=c["max_position_embeddings"], share_embeddings_and_output_weights=False,
        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v if args.vpp else None),
        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v if args.vpp else None),
        position_embedding_type="rope", rotary_base=int(c["rope_theta"]), vp_stage=v if args.vpp else None,
    )
    for v in range(args.vpp or 1)
]  # fmt: skip
full = megatron_weights(hf_weights())
for chunk in model:
    load_megatron_shard(chunk, full, args.tp, ps.get_tensor_model_parallel_rank())
    last = ps.get_data_parallel_rank() == ps.get_data_parallel_world_size() - 1  # the last DP replica
    for layer in chunk.decoder.layers:  # --fault: global layer 2 (layer_number 3), on TP rank 0 only
        if args.fault and layer.layer_number == 3 and ps.get_tensor_model_parallel_rank() == 0 and last:
            layer.mlp.register_forward_hook(lambda m, i, out: (out[0] * 1.01, *out[1:]))
params = [p for chunk in model for p in chunk.parameters()]
optimizer = torch.optim.AdamW(params, lr=LR)
# Without --out nothing is recorded: an empty step selection adds no hooks at all.
rec = Recorder(args.out or ".", mode=args.mode, format=args.format, steps=None if args.out else [])
mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
micro = 2 if args.vpp else 1  # the interleaved schedule needs micro-batches >= PP
# --split-rows: DP replica d trains rows [d * share, (d + 1) * share) of every step (else all rows)
replicas, replica = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
share = BATCH // replicas if args.split_rows else BATCH
positions = torch.arange(SEQ)[None].expand(share // micro, SEQ)


def forward_step(data_iterator, model):
    tokens = next(data_iterator)
    out = model(input_ids=tokens[:, :-1], position_ids=positions, attention_mask=mask, labels=tokens[:, 1:])

    def loss_func(per_token_loss):
        loss = per_token_loss.mean()
        rec.record_output("loss", loss)
        return loss, {"loss": loss.detach().clone()}  # the schedule divides loss in place

    return out, loss_func


for step_rows in batches(args.steps):
    tokens = step_rows[replica * share : (replica + 1) * share] if args.split_rows else step_rows
    rec.start(model)
    with megatron_cpu():
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=[iter(tokens.chunk(micro)) for _ in model], model=model,
            num_microbatches=micro, seq_length=SEQ, micro_batch_size=share // micro,
        )  # fmt: skip
    if ps.get_data_parallel_world_size() > 1:  # replicas: average the grads (finalize_model_grads' job)
        for param in params:
            dist.all_reduce(param.grad, group=ps.get_data_parallel_group())
            param.grad /= ps.get_data_parallel_world_size()
    optimizer.step()
    optimizer.zero_grad()
    rec.stop()
    rec.step()
if args.save:
    named = {
        f"{k}.{n}" if args.vpp else n: p for k, chunk in enumerate(model) for n, p in chunk.named_parameters()
    }
    loss = torch.stack([x["loss"] for x in losses]).mean() if losses else None
    saved = {"loss": loss, "params": named}
    torch.save(saved, f"{args.save}.rank{dist.get_rank()}.pt")
ps.destroy_model_parallel()
dist.destroy_process_group()
