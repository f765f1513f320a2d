"""``PrecalignLightningCallback`` records a real PyTorch Lightning run (AdamW with two weight
decay groups, warmup then cosine stepped per step, ``gradient_clip_val``, 2 accumulated
micro-batches), run as a user runs it (``lightning_run.py`` in a subprocess): every step's
scalars are measured after Lightning's own clipping and accumulation, the plan is Lightning's
own scheduler, two identical runs pass ``precalign compare``, and recording changes no loss,
LR, grad norm or parameter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from pytest_precalign import PrecalignLightningCallback  # noqa: E402
from pytest_precalign.steps.run_settings import planned_lrs  # noqa: E402
from pytest_precalign.steps.step_evidence import batch_hash, token_count  # noqa: E402
from pytest_precalign.trace.native_io import read_trace  # noqa: E402
from pytest_precalign.trace.training_record import read_run_record  # noqa: E402
from pytest_precalign.training.lightning_callback import LightningUsageError  # noqa: E402
from tests.helpers.session_once import made_once  # noqa: E402

from .framework_runs import compare, manifests, run_scripts  # noqa: E402
from .lightning_run import QUIET, ROWS, token_ids  # noqa: E402

STEPS, MICRO, CLIP = 4, 2, 0.05
# Lightning 2.6 on torch 2.13 warns about torch's own pytree API, and about a CPU DataLoader
# without workers: neither is about recording.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """Two identical recorded runs (a, b), the same run without the callback (plain) and one
    clipping at 0.1 instead (clip_0.1); once per session (``made_once``)."""
    common = ["--clip", str(CLIP), "--accumulate", str(MICRO), "--steps", str(STEPS)]
    clip = ["--clip", "0.1", "--accumulate", str(MICRO), "--steps", str(STEPS)]
    scripts = {"a": [*common, "--root", "a"], "b": [*common, "--root", "b"], "plain": common}
    scripts["clip_0.1"] = [*clip, "--root", "clip_0.1"]

    def record(out: Path) -> None:
        run_scripts("lightning_run.py", scripts, out)

    out = made_once(tmp_path_factory, "lightning_runs", record)
    return out, {name: json.loads((out / f"{name}.json").read_text()) for name in scripts}


def test_recording_changes_no_loss_lr_grad_norm_or_parameter(runs: tuple[Path, dict[str, Any]]) -> None:
    _, seen = runs
    assert seen["a"] == seen["plain"]  # every micro-batch loss, LR, grad norm, the trained params
    assert len(seen["a"]["micro_losses"]) == STEPS * MICRO


def test_every_step_measured_after_lightnings_clipping_and_accumulation(
    runs: tuple[Path, dict[str, Any]],
) -> None:
    out, seen = runs
    steps = manifests(out / "a")
    assert sorted(steps) == list(range(STEPS))
    clipped = 0
    for s, manifest in steps.items():
        scalars = read_run_record(manifest).scalars[s]
        assert scalars.micro_batches == MICRO
        # the loss the step trained on: each micro-batch's loss / accumulate_grad_batches, summed
        losses = seen["a"]["micro_losses"][s * MICRO : (s + 1) * MICRO]
        assert scalars.loss == pytest.approx(sum(losses) / MICRO, rel=1e-7)
        # before Lightning clips: the norm the module's own on_before_optimizer_step sees
        assert scalars.grad_norm == pytest.approx(seen["a"]["grad_norm"][s], rel=1e-6)
        assert scalars.lr == tuple(seen["a"]["lr"][s])  # the LR the update used, per group
        assert scalars.weight_decay == (0.1, 0.0)
        assert scalars.grad_norm is not None and scalars.clip_coef is not None
        if scalars.grad_norm > CLIP:  # Lightning clipped: the factor it multiplied the grads by
            clipped += 1
            assert scalars.clip_coef < 1
            assert scalars.clip_coef == pytest.approx(CLIP / (scalars.grad_norm + 1e-6), rel=1e-5)
        else:
            assert scalars.clip_coef == 1.0
        assert scalars.update_norm is not None and scalars.update_norm > 0
        assert scalars.skipped is False
        assert scalars.batch_hash is not None and scalars.tokens is None  # (x, y) batches: no tokens
    assert clipped == STEPS
    hashes = {read_run_record(m).scalars[s].batch_hash for s, m in steps.items()}
    assert len(hashes) == STEPS  # every step trained on other rows
    assert "initial_params" in steps[0] and "initial_params" not in steps[1]
    assert "0.weight" in steps[0]["initial_params"]  # named as module="model" records them


def test_plan_is_lightnings_own_schedule_and_settings(runs: tuple[Path, dict[str, Any]]) -> None:
    out, seen = runs
    steps = manifests(out / "a")
    settings = read_run_record(steps[0]).settings
    assert settings is not None and settings.plan is not None
    assert all("training" not in steps[s] for s in range(1, STEPS))  # written once, with step 0
    plan = settings.plan
    assert (settings.trainer, settings.framework) == ("lightning", "lightning")
    assert [list(row) for row in plan.lr] == seen["a"]["lr"]  # what the run then did, bit for bit
    assert plan.groups == (("0.weight", "2.weight"), ("0.bias", "2.bias"))
    assert plan.weight_decay == (0.1, 0.0)
    assert (plan.optimizer, plan.betas, plan.eps, plan.momentum) == ("adamw", (0.9, 0.999), 1e-8, None)
    assert (plan.clip_grad, plan.micro_batches) == (CLIP, MICRO)
    assert plan.loss_normalisation == "mean_of_micro_batch_means"
    assert (plan.precision, plan.autocast) == ("float32", False)
    assert settings.arguments["Trainer"]["accumulate_grad_batches"] == MICRO
    assert settings.frozen == ()


def test_two_identical_lightning_runs_with_clipping_pass_compare(runs: tuple[Path, dict[str, Any]]) -> None:
    out, _ = runs
    result = compare(out / "a", out / "b", "--report", str(out / "report"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "clip" not in result.stdout
    report = (out / "report" / "report.json").read_text()
    assert '"passed": true' in report and '"steps_compared": 4' in report


@pytest.fixture(scope="module")
def trainer_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same causal LM, rows and settings trained by a ``transformers.Trainer``
    (``PrecalignCallback``) and by Lightning (this callback, ``module="model"``), one
    micro-batch a step."""
    pytest.importorskip("transformers")
    return made_once(tmp_path_factory, "lightning_trainer_pair", _record_pair)


def _record_pair(out: Path) -> None:
    common = ["--accumulate", "1", "--steps", "3"]
    run_scripts("trainer_run.py", {"trainer": ["trainer", *common]}, out)
    llm = ["--model", "llm", "--clip", "1.0", "--lr", "0.01", "--schedule", "constant"]
    run_scripts("lightning_run.py", {"lightning": [*common, *llm, "--root", "lightning"]}, out)


def test_a_clean_lightning_vs_trainer_pair_passes(trainer_pair: Path) -> None:
    """Same scalars where both say them (batch hash and tokens of the token batches, grad norm,
    clipping, LR, weight decay per group), and the layers compared by ``precalign compare``
    under the same names (``module="model"``)."""
    trainer, lightning = manifests(trainer_pair / "trainer"), manifests(trainer_pair / "lightning")
    assert sorted(trainer) == sorted(lightning) == [0, 1, 2]
    ids = token_ids(3 * ROWS)
    for s in trainer:
        a = read_run_record(trainer[s]).scalars[s]
        b = read_run_record(lightning[s]).scalars[s]
        # the rows training_step received (dict batches), hashed as step_evidence hashes them
        rows = [{"input_ids": ids[s * ROWS : (s + 1) * ROWS], "labels": ids[s * ROWS : (s + 1) * ROWS]}]
        assert (b.batch_hash, b.tokens, b.micro_batches) == (batch_hash(rows), token_count(rows), 1)
        assert (a.batch_hash, a.tokens, a.lr, a.weight_decay) == (
            b.batch_hash,
            b.tokens,
            b.lr,
            b.weight_decay,
        )
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
        assert a.clip_coef == pytest.approx(b.clip_coef, rel=1e-5) and b.clip_coef is not None
    result = compare(trainer_pair / "trainer", trainer_pair / "lightning")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASSED trainer_vs_lightning[forward]" in result.stdout


def test_another_clip_norm_is_named_from_the_plan_before_step_0(runs: tuple[Path, dict[str, Any]]) -> None:
    out, _ = runs
    result = compare(out / "a", out / "clip_0.1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Step 0 diverged first: settings, origin clip_grad" in result.stdout
    assert "clip_grad: 0.05 vs 0.1" in result.stdout


# -- in process: what the plan and the usage rules do ---------------------------------------------


class _Net(L.LightningModule):
    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)
        self.automatic_optimization = not manual
        self.lrs: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _fit(module: L.LightningModule, callback: PrecalignLightningCallback, **trainer: Any) -> None:
    data = TensorDataset(torch.randn(10, 3, generator=torch.Generator().manual_seed(2)), torch.randn(10, 1))
    L.Trainer(callbacks=[callback], **QUIET, **trainer).fit(module, DataLoader(data, batch_size=2))


class _TwoSchedulers(_Net):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        by_epoch = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        by_step = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
        return [optimizer], [
            {"scheduler": by_epoch, "interval": "epoch"},
            {"scheduler": by_step, "interval": "step", "frequency": 2},
        ]


def test_plan_steps_schedulers_as_lightning_does_across_epochs(tmp_path: Path) -> None:
    """5 micro-batches an epoch, 2 per step (the third step of each epoch has one), 2 epochs, an
    epoch scheduler and a step scheduler of frequency 2 (Lightning counts the epoch's batch
    index): the plan is the LR every update then used."""
    module = _TwoSchedulers()
    callback = PrecalignLightningCallback(tmp_path / "run", mode="scalars")
    _fit(module, callback, max_epochs=2, accumulate_grad_batches=2)
    settings = callback.settings
    assert settings is not None and settings.plan is not None
    assert [row[0] for row in settings.plan.lr] == module.lrs
    assert len(module.lrs) == 6 and len(set(module.lrs)) == 6
    scalars = callback.scalars
    assert [scalars[s].micro_batches for s in range(6)] == [2, 2, 1, 2, 2, 1]
    assert (settings.plan.optimizer, settings.plan.momentum, settings.plan.betas) == ("sgd", 0.9, None)
    assert settings.plan.clip_grad is None and settings.plan.micro_batches == 2
    assert not module.trainer.optimizers[0]._optimizer_step_pre_hooks  # the run's hooks are gone
    for s in range(6):  # scalars mode: each step's folder holds no layer record
        assert read_trace(tmp_path / "run" / f"step{s}" / "rank0").records == ()


def test_planning_puts_the_scheduler_and_every_group_back_exactly() -> None:
    """OneCycleLR moves the LR and Adam's betas of every group; planning 5 steps leaves the
    scheduler's state, each group (an LR tensor stays the same tensor) as they were."""
    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))]
    optimizer = torch.optim.Adam([{"params": params[:1]}, {"params": params[1:], "lr": torch.tensor(0.01)}])
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[0.1, 0.2], total_steps=8)
    lr_tensor = optimizer.param_groups[1]["lr"]
    before_state = scheduler.state_dict()
    before_groups = [
        {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in g.items()}
        for g in optimizer.param_groups
    ]
    lrs = planned_lrs([optimizer], [scheduler], 5, lambda s: scheduler.step())
    assert lrs is not None
    assert len(lrs) == 5 and lrs[0] != lrs[3]
    assert scheduler.state_dict() == before_state
    assert optimizer.param_groups[1]["lr"] is lr_tensor
    for group, before in zip(optimizer.param_groups, before_groups, strict=True):
        assert group.keys() == before.keys()
        for key, value in before.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(group[key], value)
            else:
                assert group[key] == value
    # the real run then sees exactly the planned LRs
    seen = []
    for _ in range(5):
        seen.append([float(g["lr"]) for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    assert seen == [list(row) for row in lrs]


def test_manual_optimization_is_refused_in_one_message(tmp_path: Path) -> None:
    with pytest.raises(LightningUsageError, match="manual optimization"):
        _fit(_Net(manual=True), PrecalignLightningCallback(tmp_path / "m"), max_steps=1)


def test_an_unknown_module_is_named(tmp_path: Path) -> None:
    callback = PrecalignLightningCallback(tmp_path / "m", module="model")
    with pytest.raises(LightningUsageError, match="module='model'.*_Net has no such submodule"):
        _fit(_Net(), callback, max_steps=1)
