"""The plan of a user's run comes from its own scheduler, stepped and put back exactly
(``steps.run_settings.planned_lrs``); ``Recorder.record_settings`` writes a loop's settings;
a LoRA model recorded with the ``Recorder`` pairs with the plain model through PEFT's
``base_layer`` names, both ways, with nothing left unexplained."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_precalign import Recorder
from pytest_precalign.cli import main
from pytest_precalign.errors import ConfigError
from pytest_precalign.steps.run_settings import planned_lrs
from pytest_precalign.trace.training_record import read_run_record

STEPS = 6

Make = Callable[[torch.optim.Optimizer], Any]


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _optimizer(net: torch.nn.Module) -> torch.optim.Optimizer:
    first, last = net[0], net[2]
    return torch.optim.AdamW(
        [{"params": list(first.parameters()), "weight_decay": 0.1}, {"params": list(last.parameters())}],
        lr=0.01,
    )


SCHEDULERS: dict[str, Make] = {
    # moves the groups' betas too (cycle_momentum)
    "one_cycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=[0.05, 0.02], total_steps=STEPS + 1),
    "users_own": lambda o: torch.optim.lr_scheduler.LambdaLR(o, [lambda s: 0.5**s, lambda s: 1.0 / (1 + s)]),
    "chained": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o,
        [
            torch.optim.lr_scheduler.LinearLR(o, 0.1, total_iters=2),
            torch.optim.lr_scheduler.ExponentialLR(o, 0.9),
        ],
        milestones=[2],
    ),
}


def _train(make: Make, plan: bool) -> tuple[list[list[float]], list[Any], list[torch.Tensor], Any]:
    net = _net()
    optimizer = _optimizer(net)
    scheduler = make(optimizer)
    planned = planned_lrs([optimizer], [scheduler], STEPS) if plan else None
    used, betas, losses = [], [], []
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(STEPS):
        used.append([g["lr"] for g in optimizer.param_groups])
        betas.append([g["betas"] for g in optimizer.param_groups])
        loss = net(x).square().mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return used, betas, losses, planned


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_the_plan_is_the_runs_own_schedule_and_leaves_it_unchanged(kind: str) -> None:
    used, betas, losses, planned = _train(SCHEDULERS[kind], plan=True)
    bare_used, bare_betas, bare_losses, _ = _train(SCHEDULERS[kind], plan=False)
    assert planned == tuple(tuple(step) for step in used)
    assert len({tuple(step) for step in used}) > 1  # the schedule moves
    assert (used, betas) == (bare_used, bare_betas)  # bitwise: the same floats
    assert all(torch.equal(a, b) for a, b in zip(losses, bare_losses, strict=True))


def test_a_plateau_scheduler_has_no_plan() -> None:
    optimizer = _optimizer(_net())
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    assert planned_lrs([optimizer], [scheduler], 3) is None
    assert planned_lrs([optimizer], [], 2) == ((0.01, 0.01), (0.01, 0.01))


def test_recorder_record_settings_writes_the_loops_plan(tmp_path: Path) -> None:
    net = _net()
    optimizer = _optimizer(net)
    scheduler = SCHEDULERS["users_own"](optimizer)
    net[0].bias.requires_grad_(False)
    with Recorder(tmp_path / "rec", mode="scalars") as rec:
        settings = rec.record_settings(
            net, optimizer, scheduler, steps=3, clip_grad=1.0, micro_batches=2,
            loss_normalisation="mean_of_micro_batch_means", arguments={"schedule": "0.5 ** step"},
        )  # fmt: skip
        for _ in range(3):
            rec.record_scalars(loss=1.0, lr=[g["lr"] for g in optimizer.param_groups])
            rec.stop()
            rec.step()
            optimizer.step()
            scheduler.step()
    manifest = json.loads((tmp_path / "rec" / "step0" / "rank0" / "manifest.json").read_text())
    record = read_run_record(manifest)
    assert record.settings == settings and settings.trainer == "recorder"
    plan = settings.plan
    assert plan is not None
    assert plan.lr == ((0.01, 0.01), (0.005, 0.005), (0.0025, 0.01 * (1.0 / 3)))  # LambdaLR: base_lr * factor
    assert plan.groups == (("0.weight", "0.bias"), ("2.weight", "2.bias"))
    assert (plan.optimizer, plan.weight_decay, plan.clip_grad, plan.micro_batches) == (
        "adamw",
        (0.1, 0.01),
        1.0,
        2,
    )
    assert (plan.precision, plan.autocast, plan.betas) == ("float32", False, (0.9, 0.999))
    assert settings.frozen == ("0.bias",) and settings.arguments == {"schedule": "0.5 ** step"}
    assert manifest["dtype"] == "float32"
    assert "training" not in json.loads((tmp_path / "rec" / "step1" / "rank0" / "manifest.json").read_text())


def test_recorder_record_settings_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    net = _net()
    rec = Recorder(tmp_path / "rec")
    with pytest.raises(ConfigError, match=r"steps must be an integer >= 1, got 0") as excinfo:
        rec.record_settings(net, _optimizer(net), steps=0)
    assert "\n" not in str(excinfo.value)
    with pytest.raises(ConfigError, match=r"unknown precision 'bf16' \(allowed: float32, bfloat16"):
        rec.record_settings(net, _optimizer(net), steps=2, precision="bf16")


def _record_forward(root: Path, lora: bool) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    config._attn_implementation = "eager"
    model: Any = Qwen2ForCausalLM(config)
    if lora:  # at initialisation lora_B is zero: the wrapped model computes what the plain one does
        model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    with Recorder(root, mode="stats", grads=False) as rec:  # a forward, as of a merged or plain model
        rec.start(model)
        rec.record_output("logits", model(input_ids=ids).logits)
        rec.stop()
    return root / "step0" / "rank0"


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft 0.21
@pytest.mark.parametrize("lora_side", ["candidate", "baseline"])
def test_a_lora_model_pairs_with_the_plain_one_through_base_layer(
    tmp_path: Path, lora_side: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, lora = _record_forward(tmp_path / "plain", False), _record_forward(tmp_path / "lora", True)
    sides = [plain, lora] if lora_side == "candidate" else [lora, plain]
    assert main(["compare", *map(str, sides), "--report", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    cases = report["cases"]  # one per phase: forward, step
    assert len(cases) == 2
    for case in cases:
        assert (case["coverage"]["unexplained_baseline"], case["coverage"]["unexplained_candidate"]) == (0, 0)
    unmatched = [u for case in cases for side in case["unmatched"].values() for u in side]
    assert unmatched and all(u["reason"] for u in unmatched)
    names = {u["name"] for u in unmatched}
    assert "model.layers.0.self_attn.q_proj.base_layer" in names  # the wrapper's inner layer
    assert "model.layers.0.self_attn.q_proj.base_layer.weight" not in names  # paired with q_proj.weight
    assert "model.layers.0.self_attn.q_proj.lora_A.default" in names


def test_a_scheduler_that_cannot_step_through_the_plan_is_one_message_and_left_as_it_was() -> None:
    from pytest_precalign.errors import RecorderError

    optimizer = _optimizer(_net())
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=2)
    before = ([dict(g, params=None) for g in optimizer.param_groups], scheduler.state_dict())
    with pytest.raises(RecorderError, match=r"OneCycleLR.step\(\) raised at planned step 3 .*plan=False"):
        planned_lrs([optimizer], [scheduler], 5)
    assert ([dict(g, params=None) for g in optimizer.param_groups], scheduler.state_dict()) == before


def test_the_loss_normalisation_of_a_trainer_run_is_what_its_release_passes(tmp_path: Path) -> None:
    """Whether the Trainer passes ``num_items_in_batch`` (a per-token loss over the step) or not
    (a mean of micro-batch means) depends on its release: never before 4.46 (transformers PR
    #34191), in 4.46.x to a forward with ``**loss_kwargs`` only, from 4.47 to any ``**kwargs``."""
    from transformers import TrainingArguments

    from pytest_precalign.steps.run_settings import trainer_settings

    class TakesKwargs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            return self.proj(x)

    class TakesLossKwargs(TakesKwargs):
        def forward(self, x: torch.Tensor, **loss_kwargs: Any) -> torch.Tensor:
            return self.proj(x)

    args = TrainingArguments(
        output_dir=str(tmp_path), gradient_accumulation_steps=2, use_cpu=True, report_to=[]
    )
    told = {}
    for model in (TakesKwargs(), TakesLossKwargs()):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for version in ("4.45.2", "4.46.0", "4.47.0", "5.24.0"):
            plan = trainer_settings(args, model, optimizer, None, 2, framework=("transformers", version)).plan
            assert plan is not None
            told[type(model).__name__, version] = plan.loss_normalisation
    means, per_token = "mean_of_micro_batch_means", "per_token_over_step"
    assert told == {
        ("TakesKwargs", "4.45.2"): means,
        ("TakesKwargs", "4.46.0"): means,
        ("TakesKwargs", "4.47.0"): per_token,
        ("TakesKwargs", "5.24.0"): per_token,
        ("TakesLossKwargs", "4.45.2"): means,
        ("TakesLossKwargs", "4.46.0"): per_token,
        ("TakesLossKwargs", "4.47.0"): per_token,
        ("TakesLossKwargs", "5.24.0"): per_token,
    }
