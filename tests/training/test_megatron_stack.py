"""The megatron trainer: OptimizerSpec translated into megatron-core's own arguments, the plan
from its own OptimizerParamScheduler, and steps of its real stack (DDP, get_megatron_optimizer,
finalize_model_grads, the pipeline schedule) recorded as StepScalars, bitwise neutral."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch

from pytest_precalign.errors import CaseError
from pytest_precalign.megatron_core.megatron_stack import build_megatron_stack, megatron_arguments
from pytest_precalign.steps.spec import OptimizerSpec, ScheduleSpec

from .megatron_tiny import logits_of, split, tiny_gpt, token_batches

SPEC = OptimizerSpec(
    lr=1e-2,
    betas=(0.9, 0.95),
    weight_decay=0.1,
    schedule=ScheduleSpec(warmup_steps=2, decay="cosine", min_lr=1e-3),
    clip_grad=1.0,
    micro_batches=2,
)


def test_translation_counts_samples_and_turns_clipping_off_explicitly() -> None:
    args = megatron_arguments(OptimizerSpec(lr=1e-3, schedule=ScheduleSpec(warmup_steps=2, decay="cosine",
                                                                          min_lr=1e-4)), 10, 8, "bfloat16")  # fmt: skip
    assert args.optimizer["clip_grad"] == 0.0  # OptimizerConfig's default would clip at 1.0
    assert (
        args.optimizer["min_lr"] == 1e-4
        and args.optimizer["bf16"]
        and args.optimizer["decoupled_weight_decay"]
    )
    assert args.scheduler["lr_warmup_steps"] == 16 and args.scheduler["lr_decay_steps"] == 80
    assert args.scheduler["init_lr"] == 0.0 and args.increment == 8
    assert (
        megatron_arguments(OptimizerSpec(name="adam"), 3, 2, "float32").optimizer["decoupled_weight_decay"]
        is False
    )
    with pytest.raises(
        CaseError, match=r"the case.s steps \(no decay_steps given\) \(2\) must be > warmup_steps \(2\)"
    ):
        megatron_arguments(
            OptimizerSpec(schedule=ScheduleSpec(warmup_steps=2, decay="linear")), 2, 1, "float32"
        )


def _train(
    steps: int, spec: OptimizerSpec = SPEC, dtype: torch.dtype = torch.float32
) -> tuple[Any, list[Any]]:
    stack = build_megatron_stack([tiny_gpt(dtype)], spec, steps, global_batch=4)
    scalars = []
    for step, batch in enumerate(token_batches(steps)):
        _, s = stack.train_step(step, split(batch, spec.micro_batches), logits_of)
        scalars.append(s)
    return stack, scalars


def test_plan_is_megatrons_scheduler_and_the_steps_follow_it(megatron_world: None) -> None:
    steps = 10
    stack = build_megatron_stack([tiny_gpt()], SPEC, steps, global_batch=4)
    manifest = stack.training_manifest(steps, micro_batches=2).as_dict()
    plan = manifest["plan"]
    assert manifest["trainer"] == "megatron" and manifest["framework"]["name"] == "megatron-core"
    assert manifest["arguments"]["OptimizerParamScheduler"]["lr_decay_style"] == "cosine"
    decayed, plain = plan["groups"]
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in decayed
    assert (
        "decoder.layers.0.self_attention.linear_qkv.bias" in plain
        and "decoder.final_layernorm.weight" in plain
    )
    assert plan["weight_decay"] == [0.1, 0.0]
    lrs = [row[0] for row in plan["lr"]]
    expected = [0.0, 5e-3] + [1e-3 + 0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) * 9e-3 for s in range(2, 10)]
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert [g["lr"] for g in stack.optimizer.param_groups] == [0.0, 0.0]  # the plan left it untouched
    for step, batch in enumerate(token_batches(steps)):
        _, scalars = stack.train_step(step, split(batch, 2), logits_of)
        assert list(scalars.lr) == plan["lr"][step], step
        assert list(scalars.weight_decay) == plan["weight_decay"]
        assert scalars.micro_batches == 2 and scalars.tokens == 64 and scalars.skipped is False
        assert scalars.grad_norm > 0 and 0 < scalars.clip_coef <= 1.0 and scalars.loss_scale == 1.0
        if step == 0:
            assert scalars.update_norm == 0.0  # LR 0 at the first update of a warmup
        else:
            assert scalars.update_norm > 0


def test_clip_coef_is_measured_from_megatrons_clipping(megatron_world: None) -> None:
    spec = OptimizerSpec(lr=1e-3, clip_grad=1e-3)
    _, (first,) = _train(1, spec)
    assert first.clip_coef == pytest.approx(1e-3 / (first.grad_norm + 1e-6), rel=1e-5)
    _, (unclipped,) = _train(1, OptimizerSpec(lr=1e-3, clip_grad=None))
    assert unclipped.clip_coef == 1.0 and unclipped.grad_norm == pytest.approx(first.grad_norm, rel=0, abs=0)


def test_per_token_loss_over_micro_batches_matches_one_batch(megatron_world: None) -> None:
    """Two micro-batches with -100 labels in one of them: the loss and grads are the step's
    per-token mean, as with the batch in one piece."""
    batch = token_batches(1)[0]
    batch["labels"][0, 3:] = -100
    norms, losses = [], []
    for micro in (1, 2):
        stack = build_megatron_stack([tiny_gpt()], OptimizerSpec(lr=1e-3, micro_batches=micro), 1, 4)
        losses_reduced, scalars = stack.train_step(0, split(batch, micro), logits_of)
        assert len(losses_reduced) == micro
        norms.append(scalars.grad_norm)
        losses.append(scalars.loss)
        assert scalars.tokens == 4 * 16 - 13
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)


def test_no_decay_globs_become_megatron_param_groups(megatron_world: None) -> None:
    spec = OptimizerSpec(lr=1e-3, weight_decay=0.1, no_decay=("*layernorm*",))
    stack = build_megatron_stack([tiny_gpt()], spec, 2, 4)
    decayed, plain = stack.plan(2).groups
    assert "decoder.layers.0.self_attention.linear_qkv.bias" in decayed  # a bias decays now
    assert sorted(plain) == sorted(
        n for n, _ in stack.chunks[0].module.named_parameters() if "layernorm" in n
    )
    assert stack.arguments.as_json()["config_overrides"][0]["ParamKey"]["name"] == ["module.*layernorm*"]


def test_a_bf16_model_sits_in_float16module_and_its_no_decay_globs_still_match(megatron_world: None) -> None:
    """Megatron-LM's bf16 model: DDP(Float16Module(model)), so the chunk names a parameter
    after ``module.module.``; a glob anchored at the model's own name still selects it."""
    spec = OptimizerSpec(lr=1e-3, weight_decay=0.1, no_decay=("decoder.final_layernorm.weight",))
    stack = build_megatron_stack([tiny_gpt(torch.bfloat16)], spec, 2, 4)
    assert type(stack.chunks[0].module).__name__ == "Float16Module"
    decayed, plain = stack.plan(2).groups
    assert (
        plain == ("decoder.final_layernorm.weight",) and "decoder.layers.0.input_layernorm.weight" in decayed
    )
    assert stack.arguments.as_json()["wrappers"] == ["DistributedDataParallel", "Float16Module"]


def test_recording_is_bitwise_neutral(megatron_world: None) -> None:
    """The recorded steps and the same steps by megatron-core's calls alone give bitwise the same
    losses, grad norms, LRs and parameters."""
    from pytest_precalign import megatron_cpu
    from pytest_precalign.megatron_core.megatron_stack import per_token_loss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel import get_forward_backward_func

    steps = 3
    recorded, scalars = _train(steps)
    bare = build_megatron_stack([tiny_gpt()], SPEC, steps, global_batch=4)
    (ddp,) = bare.chunks

    def forward_step(data_iterator: Any, model: Any) -> Any:
        batch = next(data_iterator)
        return logits_of(model, batch), lambda logits: per_token_loss(batch["labels"], logits, 60, 2)

    for step, batch in enumerate(token_batches(steps)):
        ddp.zero_grad_buffer()
        bare.optimizer.zero_grad()
        lr = bare.optimizer.param_groups[0]["lr"]
        with megatron_cpu():
            losses = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter(split(batch, 2)), model=[ddp],
                num_microbatches=2, seq_length=16, micro_batch_size=2,
            )  # fmt: skip
            _, grad_norm, _ = bare.optimizer.step()
        bare.scheduler.step(increment=4)
        loss = sum(float(x["loss"][0]) for x in losses) / 60  # 2 x 2 rows of 15 next tokens
        assert (loss, grad_norm, lr) == (scalars[step].loss, scalars[step].grad_norm, scalars[step].lr[0])
    for (name, a), (_, b) in zip(
        recorded.chunks[0].module.named_parameters(), ddp.module.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_bf16_trains_with_fp32_main_params(megatron_world: None) -> None:
    stack, scalars = _train(3, dtype=torch.bfloat16)
    (inner,) = stack.optimizer.chained_optimizers
    assert type(inner).__name__ == "Float16OptimizerWithFloat16Params"
    assert stack.arguments.optimizer["bf16"] and stack.arguments.optimizer["main_params_dtype"] == "float32"
    assert all(p.dtype == torch.float32 for group in inner.fp32_from_float16_groups for p in group)
    assert stack.plan(3).groups[0]  # main params named by their model params
    assert all(s.loss is not None and math.isfinite(s.loss) and not s.skipped for s in scalars)
    assert scalars[2].update_norm > 0


def test_public_helper_records_a_users_own_megatron_loop(megatron_world: None, tmp_path: Any) -> None:
    """A user's own megatron-core loop (their DDP, optimizer, scheduler, forward_step_func with a
    mean loss) through megatron_train_step, with the Recorder around it: the step folders hold
    the main_grad records and the scalars are Megatron's."""
    from pytest_precalign import Recorder, megatron_cpu, megatron_train_step
    from pytest_precalign.trace.native_io import read_trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    model = tiny_gpt()
    with megatron_cpu():
        ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
        optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-3, min_lr=1e-3, clip_grad=1.0), [ddp])
    scheduler = OptimizerParamScheduler(optimizer, 0.0, 1e-3, 1e-3, 1, 3, "linear", 0.0, 0.0, 3, "constant")

    def forward_step(data_iterator: Any, model: Any) -> Any:
        batch = next(data_iterator)
        logits = logits_of(model, batch)

        def loss_func(logits: torch.Tensor) -> Any:
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, 128).float(), batch["labels"][:, 1:].reshape(-1)
            )
            computed.append(float(loss))
            return loss, {"lm loss": loss.detach().clone()}  # the schedule divides `loss` in place

        return logits, loss_func

    rec = Recorder(tmp_path / "run", mode="stats", param_grads="step")
    seen = []
    for step, batch in enumerate(token_batches(2)):
        computed: list[float] = []
        rec.start(model)
        losses, scalars = megatron_train_step(
            step=step, forward_step_func=forward_step, data_iterator=iter(split(batch, 2)), model=[ddp],
            optimizer=optimizer, scheduler=scheduler, num_microbatches=2, seq_length=16, micro_batch_size=2,
            batches=[batch], grads_ready=rec.grads_ready,
        )  # fmt: skip
        rec.stop()
        rec.step()
        seen.append(scalars)
        assert len(losses) == 2 and scalars.loss == pytest.approx(sum(computed) / 2, rel=1e-6)
        assert scalars.tokens == 64
    assert [s.lr[0] for s in seen] == [0.0, 1e-3]
    assert seen[0].update_norm == 0.0 and seen[1].update_norm > 0
    trace = read_trace(tmp_path / "run" / "step1" / "rank0")
    grads = {r.name for r in trace.records if r.kind == "param_grad"}
    assert "output_layer.weight" in grads and "decoder.final_layernorm.weight" in grads
