"""With ``calculate_per_token_loss=True`` megatron-core divides a step's gradients by its number of
tokens in ``finalize_model_grads`` (the loss function returns the summed loss and its token
count); the MoE auxiliary load-balancing loss, whose gradient ``MoEAuxLossAutoScaler`` adds per
micro-batch, was divided by the tokens too: its pull on the routers shrank by the number of
tokens, silently (Megatron Core 0.12.0 CHANGELOG, MoE bug fixes: "Fix MoE Aux loss scaling for
per token loss"). The fix, in ``TopKRouter.apply_load_balancing_loss`` (megatron-core 0.11.0 ->
0.12.0; the z-loss got the same)::

    -        activation = MoEAuxLossAutoScaler.apply(activation, aux_loss)
    +        if self.calculate_per_token_loss:
    +            # Scale the aux_loss by the number of tokens.
    +            ...
    +            activation = MoEAuxLossAutoScaler.apply(activation, aux_loss * activation.shape[0])
    +        else:
    +            activation = MoEAuxLossAutoScaler.apply(activation, aux_loss)

Releases: buggy megatron-core 0.11.0, fixed 0.12.0 (the first with the fix; from 0.12.1 the
routing probs are multiplied inside the experts' activation, which every expert's records show
between 0.11 and those releases, the clean twin too), each beside torch 2.13 on the CPU (inside
``megatron_cpu()``). User path: the user's own megatron-core loop (``_megatron.py``: a tiny GPT
with 8 experts, top-2, aux loss 1e-2) through Megatron's ``DistributedDataParallel`` and
``finalize_model_grads`` with ``calculate_per_token_loss=True``, AdamW on the main grads,
recorded with ``Recorder`` (stats). Twin: the same run with ``calculate_per_token_loss=False``
(the loss averaged per micro-batch, nothing divided afterwards), where both releases agree."""

from __future__ import annotations

from pathlib import Path

from _megatron import init_world, moe_gpt, train
from _tiny import main


def record(out: Path, side: str, trigger: bool) -> None:
    init_world()
    model, config = moe_gpt(moe_aux_loss_coeff=1e-2, calculate_per_token_loss=trigger)
    train(out, model, config, ddp=True)


if __name__ == "__main__":
    main(record)
