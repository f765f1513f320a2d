"""The catalogue of ``benchmarks/real_bugs.py``: real, public silent bugs of the stacks users
train and serve with, each a script here (``NAME.py``) that reproduces it at CPU scale on the
path a user hitting it takes, with its source and the verdict a right answer gives.

``step``/``what``/``origin``: the first optimizer step whose numbers the bug changes
(0-based), the class of what it changes first (``vocabulary.TrainingClass``: ``settings``,
``schedule``, ``forward``, ``loss``, ``backward``...) and a substring the verdict's origin or
its evidence must hold (``a|b``: either; ``=name``: exactly that origin). ``what`` may list accepted classes the same way.
``fixed_release`` / ``buggy_release``: the pip requirements of a venv the side records in
(None: the current interpreter); ``why_no_release``: why a re-implementation stands in for the
releases (shown in the results)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    name: str
    stack: str
    source: str
    path: str
    step: int
    what: str
    origin: str
    fixed_release: str | None = None
    buggy_release: str | None = None
    why_no_release: str = ""  # a re-implementation's reason (shown in the results)


TF_448 = "transformers==4.48.3 accelerate==1.3.0"
TF_449 = "transformers==4.49.0 accelerate==1.3.0"
PEFT_BUGGY = "peft==0.17.1 transformers==4.57.6"  # the last peft without PR #2775
PEFT_FIXED = "peft==0.18.0 transformers==4.57.6"  # the first with it
GC_BUGGY = "transformers==4.57.6 peft==0.18.1"  # the last transformers 4.x
GC_FIXED = "transformers==5.0.0 peft==0.18.1"  # the first that enables the input grads
LIGHTNING_OPEN = (
    "no fixed release: the issue is open (Lightning 2.6.x); the buggy side is Lightning as "
    "released, the fixed side the user's own workaround in training_step"
)
# The releases around each transformers fix (the last with the bug, the first with the fix).
TF_4382, TF_4390 = "transformers==4.38.2", "transformers==4.39.0"
TF_4412, TF_4420 = "transformers==4.41.2", "transformers==4.42.0"
TF_4513, TF_4524 = "transformers==4.51.3", "transformers==4.52.4 accelerate==1.15.0"
TF_4530, TF_4531 = "transformers==4.53.0 accelerate==1.15.0", "transformers==4.53.1 accelerate==1.15.0"
# the last release without the per-token aux-loss scaling fix and the first with it (0.12.1 on
# also moves the routing probs into the experts' activation: a refactor a clean upgrade shows)
MCORE_0110, MCORE_0120 = "megatron-core==0.11.0", "megatron-core==0.12.0"
MCORE_0123, MCORE_0131 = "megatron-core==0.12.3", "megatron-core==0.13.1"  # around the group-routing fix
TF_4452, TF_4460 = "transformers==4.45.2 accelerate==1.0.1", "transformers==4.46.0 accelerate==1.0.1"
# trl 0.7.x imports transformers.top_k_top_p_filtering (removed in 4.39): the last 4.38 beside it
TRL_0710 = "trl==0.7.10 transformers==4.38.2 accelerate==0.27.2"
TRL_0711 = "trl==0.7.11 transformers==4.38.2 accelerate==0.27.2"
# the last torch before SDPA's _safe_softmax (PR #133882, first released in 2.5.0) and a 2.5
TORCH_241, TORCH_251 = "torch==2.4.1", "torch==2.5.1"
TF_5100, TF_5101 = "transformers==5.10.0 accelerate==1.15.0", "transformers==5.10.1 accelerate==1.15.0"

BUGS: tuple[Bug, ...] = (
    Bug(
        "ga_loss_normalisation",
        "transformers",
        "transformers PR #34191",
        "Trainer + PrecalignCallback",
        0,
        "settings|loss",
        "loss_normalisation|loss",
        fixed_release=TF_4460,
        buggy_release=TF_4452,
    ),
    Bug(
        "custom_model_no_loss_kwargs",
        "transformers",
        "transformers issue #37766",
        "Trainer + PrecalignCallback",
        0,
        "settings|loss",
        "loss_normalisation|loss",
        why_no_release="not a release's bug: every release since 4.46 skips num_items_in_batch for a "
        "model whose forward takes no **kwargs (the user's own model is the trigger)",
    ),
    Bug(
        "num_items_overcount",
        "transformers",
        "transformers PR #46204",
        "Trainer + PrecalignCallback",
        0,
        "loss",
        "loss",
        fixed_release=TF_5101,
        buggy_release=TF_5100,
    ),
    Bug(
        "packing_cross_attention",
        "transformers",
        "transformers PR #39194",
        "Trainer + PrecalignCallback(stats)",
        0,
        "forward",
        "model.layers.0.self_attn",
        fixed_release=TF_4531,
        buggy_release=TF_4530,
    ),
    Bug(
        "norm_named_norm_decayed",
        "transformers",
        "transformers PR #38922",
        "Trainer + PrecalignCallback",
        0,
        "settings",
        "model.norm.weight",
        fixed_release=TF_4530,
        buggy_release=TF_4524,
    ),
    Bug(
        "trainer_decays_rmsnorm",
        "transformers",
        "transformers PR #35927 (4.48.3 -> 4.49.0)",
        "Trainer + PrecalignCallback",
        0,
        "settings",
        "weight_decay|layernorm",
        fixed_release=TF_449,
        buggy_release=TF_448,
    ),
    Bug(
        "eager_softmax_upgrade",
        "transformers",
        "issue #46 (upgrade 4.49.0 -> 5.24.0, planted)",
        "Recorder(stats) under each release",
        0,
        "forward",
        "model.layers.0.self_attn",
        fixed_release=TF_449,
    ),
    Bug(
        "gemma_gelu_tanh",
        "transformers",
        "transformers PR #29402",
        "Recorder(stats)",
        0,
        "forward",
        "act_fn",
        fixed_release=TF_4390,
        buggy_release=TF_4382,
    ),
    Bug(
        "gemma_rmsnorm_bf16",
        "transformers",
        "transformers PR #29402",
        "Recorder(stats), bf16",
        0,
        "forward",
        "model.layers.0.input_layernorm",
        fixed_release=TF_4390,
        buggy_release=TF_4382,
    ),
    Bug(
        "gemma_normalizer_dtype",
        "transformers",
        "transformers PR #29402",
        "Recorder(stats), bf16",
        0,
        "forward",
        # the normaliser is multiplied in GemmaModel.forward itself, between embed_tokens and
        # layers.0 (the releases' code): the model's own code, exactly
        "=model",
        fixed_release=TF_4390,
        buggy_release=TF_4382,
    ),
    Bug(
        "sliding_window_off_by_one",
        "transformers",
        "transformers PR #26792, issue #29623",
        "Recorder(stats)",
        0,
        "forward",
        "model.layers.0.self_attn",
        fixed_release=TF_4420,
        buggy_release=TF_4412,
    ),
    Bug(
        "qwen2_use_sliding_window_ignored",
        "transformers",
        "transformers issue #38002",
        "Recorder(stats)",
        0,
        "forward",
        "model.layers.0.self_attn",
        fixed_release=TF_4524,
        buggy_release=TF_4513,
    ),
    Bug(
        "llama3_rope_scaling_dropped",
        "transformers / unsloth",
        "unsloth PR #6197",
        "Recorder(stats)",
        0,
        "forward",
        "model.rotary_emb",
        why_no_release="unsloth's own Llama loader dropped the scaling; no transformers release carries it",
    ),
    Bug(
        "sdpa_fully_masked_rows_nan",
        "torch",
        "pytorch PR #131060, PR #133882 (issues #41508, #103749)",
        "Recorder(stats), own model calling SDPA",
        0,
        "forward",
        "layers.0.self_attn",
        fixed_release=TORCH_251,
        buggy_release=TORCH_241,
    ),
    Bug(
        "peft_set_scale_rslora",
        "peft",
        "peft issue #2733, PR #2775 (0.17.1 -> 0.18.0)",
        "Recorder(stats), LoRA",
        0,
        "forward",
        "q_proj",
        fixed_release=PEFT_FIXED,
        buggy_release=PEFT_BUGGY,
    ),
    Bug(
        "grad_checkpointing_frozen_inputs",
        "transformers / peft",
        "transformers issue #21381, issue #42489, PR #42494 (4.57.6 -> 5.0.0)",
        "Recorder(stats), LoRA",
        0,
        "backward",
        "lora",
        fixed_release=GC_FIXED,
        buggy_release=GC_BUGGY,
    ),
    Bug(
        "ipo_summed_logps",
        "trl",
        "trl PR #1265 (issues #1294, #1677)",
        'DPOTrainer(loss_type="ipo") + PrecalignCallback(stats)',
        0,
        # the policy is its reference at step 0: both IPO losses are (0 - 1/(2 beta))^2, and the
        # length factor enters through the loss's gradient (the grad w.r.t. lm_head's output)
        "loss",
        "loss",
        fixed_release=TRL_0711,
        buggy_release=TRL_0710,
    ),
    Bug(
        "accelerate_scheduler_every_micro_batch",
        "accelerate",
        "accelerate issue #963, PR #999",
        "AccelerateSteps",
        0,
        "schedule",
        "lr",
        why_no_release=(
            "tried: accelerate 0.15.0 (buggy) and 0.16.0 (fixed, commit 55a5284) beside torch 2.13: "
            "0.16.0's prepare() returns the LambdaLR unwrapped (0.15.0 wraps it in AcceleratedScheduler), "
            "so the user's scheduler.step() runs at every micro-batch on both sides and the releases "
            "record the same LRs (0, 2.5e-3, 5e-3, 4.17e-3 at micro-batches 0-3; measured); "
            "the re-implementation quotes the fix's diff"
        ),
    ),
    Bug(
        "lightning_partial_accumulation",
        "lightning",
        "Lightning issue #19987",
        "PrecalignLightningCallback",
        2,
        "loss",
        "loss",
        why_no_release=LIGHTNING_OPEN,
    ),
    Bug(
        "lightning_mean_of_micro_batch_means",
        "lightning",
        "Lightning issue #20350",
        "PrecalignLightningCallback",
        0,
        "loss",
        "loss",
        why_no_release=LIGHTNING_OPEN,
    ),
    Bug(
        "megatron_moe_aux_loss_group_routing",
        "megatron-core",
        "Megatron Core 0.13.0 CHANGELOG (MoE bug fixes: aux loss with group limited routing / expert bias)",
        "Recorder(stats), own megatron-core MoE loop",
        0,
        "backward",
        # the aux loss adds only a gradient (MoEAuxLossAutoScaler): the loss matches, the
        # backward enters wrong at a MoE router
        "mlp.router",
        fixed_release=MCORE_0131,
        buggy_release=MCORE_0123,
    ),
    Bug(
        "megatron_moe_aux_loss_per_token",
        "megatron-core",
        "Megatron Core 0.12.0 CHANGELOG (MoE bug fixes: aux loss scaling for per token loss)",
        "Recorder(stats), own megatron-core MoE loop, DDP + finalize_model_grads",
        0,
        "backward",
        "mlp.router",
        fixed_release=MCORE_0120,
        buggy_release=MCORE_0110,
    ),
)

# Found while searching, not reproduced here yet (with their sources).
CANDIDATES: tuple[str, ...] = (
    "megatron-core: wrong embedding gradients with the distributed optimizer and shared "
    "embeddings across PP x DP ranks (Megatron-LM issue #844): needs 4 ranks (PP 2 x DP 2).",
    "megatron-core: learnable attention sinks (softmax_offset) left out of the clipping norm "
    "under TP, and the other parallelism-composition bugs listed in Megatron-LM issue #7452.",
    "transformers 4.47.0: the logged loss doubled with gradient_accumulation_steps=2 "
    "(transformers PR #35438, 'Pass correct num_items_in_batch value into the training_step function'): "
    "outside the callback's supported range (transformers >= 4.49).",
    "Lightning: accumulate_grad_batches silently ignored when an epoch is shorter than it "
    "(Lightning issue #21808).",
    "transformers: Qwen2 sliding windows applied to the wrong layers with max_window_layers "
    "(transformers issue #35896).",
    "flash-attention window off by one in transformers (transformers issue #39408): needs flash-attn (GPU).",
)
