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
``megatron_cpu()``). User path: the user's own megatron-core loop (``_megatron.py``: a tiny GPT with 8 experts,
top-2, the local spec, ``get_forward_backward_func``, AdamW) with aux loss 1e-2 and 4 expert
groups of which each token may use 1, recorded with ``Recorder`` (stats). Twin: the same run
without the group limit (plain top-2), where both releases count the same tokens."""

from __future__ import annotations

from pathlib import Path

from _megatron import init_world, moe_gpt, train
from _tiny import main

AUX_LOSS_COEFF = 1e-2


def record(out: Path, side: str, trigger: bool) -> None:
    init_world()
    groups = {"moe_router_num_groups": 4, "moe_router_group_topk": 1} if trigger else {}
    model, config = moe_gpt(moe_aux_loss_coeff=AUX_LOSS_COEFF, **groups)
    train(out, model, config)


if __name__ == "__main__":
    main(record)
