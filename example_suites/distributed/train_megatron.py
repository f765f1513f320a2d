"""A user's own megatron-core training loop (tiny Qwen2.5, TP x PP over gloo), recorded by pytest-precalign.

python -m torch.distributed.run --nproc_per_node 4 train_megatron.py --tp 2 --pp 2 --steps 2 --out DIR
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torch.distributed as dist
from tiny_qwen import BATCH, CONFIG, LR, SEED, SEQ, batches, hf_weights, megatron_shard, megatron_weights

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
p.add_argument("--steps", type=int, default=2)
p.add_argument("--out", default=None, help="record into this folder (no recording without it)")
p.add_argument("--mode", default="tensor", help="stats | tensor | hash")
p.add_argument("--format", default="native", help="native (trace folders) | msprobe (msprobe's dump layout)")
p.add_argument("--fault", action="store_true", help="scale global layer 2's mlp output on one rank")
p.add_argument("--save", default=None, help="save this rank's last loss and params to SAVE.rank<R>.pt")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
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
)  # fmt: skip
model = GPTModel(
    config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=c["vocab_size"],
    max_sequence_length=c["max_position_embeddings"], pre_process=ps.is_pipeline_first_stage(),
    post_process=ps.is_pipeline_last_stage(), share_embeddings_and_output_weights=False,
    position_embedding_type="rope", rotary_base=int(c["rope_theta"]),
)  # fmt: skip
shard = megatron_shard(megatron_weights(hf_weights()), args.tp, ps.get_tensor_model_parallel_rank(),
                       args.pp, ps.get_pipeline_model_parallel_rank())  # fmt: skip
with torch.no_grad():
    for name, param in model.named_parameters():
        param.copy_(shard[name])
per_stage = c["num_hidden_layers"] // args.pp
if args.fault and ps.get_pipeline_model_parallel_rank() == 2 // per_stage and ps.get_tensor_model_parallel_rank() == 0:  # fmt: skip
    model.decoder.layers[2 % per_stage].mlp.register_forward_hook(lambda m, i, out: (out[0] * 1.01, *out[1:]))
optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
# Without --out nothing is recorded: an empty step selection adds no hooks at all.
rec = Recorder(args.out or ".", mode=args.mode, format=args.format, steps=None if args.out else [])
mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
positions = torch.arange(SEQ)[None].expand(BATCH, SEQ)


def forward_step(data_iterator, model):
    tokens = next(data_iterator)
    out = model(input_ids=tokens[:, :-1], position_ids=positions, attention_mask=mask, labels=tokens[:, 1:])

    def loss_func(per_token_loss):
        loss = per_token_loss.mean()
        rec.record_output("loss", loss)
        return loss, {"loss": loss.detach()}

    return out, loss_func


for tokens in batches(args.steps):
    rec.start(model)
    with megatron_cpu():
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter([tokens]), model=[model],
            num_microbatches=1, seq_length=SEQ, micro_batch_size=BATCH,
        )  # fmt: skip
    if ps.get_data_parallel_world_size() > 1:  # replicas: average the grads (finalize_model_grads' job)
        for param in model.parameters():
            dist.all_reduce(param.grad, group=ps.get_data_parallel_group())
            param.grad /= ps.get_data_parallel_world_size()
    optimizer.step()
    optimizer.zero_grad()
    rec.stop()
    rec.step()
if args.save:
    saved = {"loss": losses[0]["loss"] if losses else None, "params": dict(model.named_parameters())}
    torch.save(saved, f"{args.save}.rank{dist.get_rank()}.pt")
ps.destroy_model_parallel()
dist.destroy_process_group()
