"""The tensor-parallel plans ``sharded_loop.py`` gives a tiny Qwen2 (``parallelize_module``),
as a user's project module would hold them: ``plain`` (Colwise q/k/v, gate and up projections,
Rowwise o and down), ``sp`` (the same with sequence parallelism: ``SequenceParallel`` norms,
the residual stream split along the sequence), ``dtensor_out`` (gate and up projections hand
DTensors on: ``use_local_output=False``), ``custom`` (gate and up projections under the user's
own ``ParallelStyle`` subclass), ``titan`` (``sp`` as torchtitan writes its MoE layers: the MLP
under ``PrepareModuleInputOutput``, its input gathered to a DTensor and its output -- the down
projection's all-reduced sum -- split back along the sequence and handed on as the rank's local
part), ``prepared`` (``plain`` with torchtitan's ``PrepareModuleInput`` on the attention and
the MLP, inputs made replicated DTensors, and the final norm's output split along the sequence
by ``PrepareModuleOutput``, handed on as the rank's local part and gathered again by
``lm_head``)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


class OwnColwise(ParallelStyle):
    """A user's own column-parallel style: the weight's rows sharded, the input replicated, the
    rank's local output columns handed on (what ``ColwiseParallel`` does, written by hand)."""

    def _apply(self, module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
        def shard(name: str, mod: torch.nn.Module, mesh: Any) -> None:
            for key, param in list(mod.named_parameters(recurse=False)):
                sharded = torch.nn.Parameter(distribute_tensor(param, mesh, [Shard(0)]))
                mod.register_parameter(key, sharded)

        def inputs(mod: Any, args: Any, mesh: Any) -> Any:
            x = args[0]
            return (
                x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Replicate()], run_check=False),
            )

        def outputs(mod: Any, out: Any, mesh: Any) -> Any:
            return out.to_local()

        return distribute_module(module, device_mesh, shard, inputs, outputs)  # type: ignore[arg-type]


def parallelize(model: Any, mesh: Any, style: str) -> None:
    """``model``'s layers (and, with ``sp``, its embedding, final norm and LM head) over ``mesh``."""
    col, row = ColwiseParallel, RowwiseParallel
    if style in ("sp", "titan"):
        seq = Shard(1)
        top = {
            "model.embed_tokens": row(input_layouts=Replicate(), output_layouts=seq),
            "model.norm": SequenceParallel(),
            "lm_head": col(input_layouts=seq, output_layouts=Replicate()),
        }
        parallelize_module(model, mesh, top)
    if style == "prepared":
        split = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
        gathered = col(input_layouts=Shard(1), output_layouts=Replicate())
        parallelize_module(model, mesh, {"model.norm": split, "lm_head": gathered})  # type: ignore[dict-item]
    for layer in model.model.layers:
        gate_up: Any = {"custom": OwnColwise, "dtensor_out": lambda: col(use_local_output=False)}.get(
            style, col
        )
        mlp = {"gate_proj": gate_up(), "up_proj": gate_up(), "down_proj": row()}
        attn = {"q_proj": col(), "k_proj": col(), "v_proj": col(), "o_proj": row()}
        if style in ("sp", "titan"):
            mlp["down_proj"] = row(output_layouts=Shard(1))
            attn["o_proj"] = row(output_layouts=Shard(1))
            gather = {"input_kwarg_layouts": {"hidden_states": Shard(1)}}
            gather["desired_input_kwarg_layouts"] = {"hidden_states": Replicate()}
            norms = {"input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel()}
            norms["self_attn"] = PrepareModuleInput(**gather)  # type: ignore[assignment]
            norms["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))  # type: ignore[assignment]
            if style == "titan":  # the MLP's output split by the style, not by down_proj
                mlp["down_proj"] = row()
                norms["mlp"] = PrepareModuleInputOutput(  # type: ignore[assignment]
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                    output_layouts=(Replicate(),),
                    desired_output_layouts=(Shard(1),),
                )
            parallelize_module(layer, mesh, norms)  # type: ignore[arg-type]
        if style == "prepared":
            whole = {"input_kwarg_layouts": {"hidden_states": Replicate()}}
            whole["desired_input_kwarg_layouts"] = {"hidden_states": Replicate()}
            inputs = {"input_layouts": (Replicate(),), "desired_input_layouts": (Replicate(),)}
            prepare = {"self_attn": PrepareModuleInput(**whole), "mlp": PrepareModuleInput(**inputs)}
            parallelize_module(layer, mesh, prepare)  # type: ignore[arg-type]
        parallelize_module(layer.mlp, mesh, mlp)
        parallelize_module(layer.self_attn, mesh, attn)
