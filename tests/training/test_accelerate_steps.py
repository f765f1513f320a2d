"""``AccelerateSteps`` records a real custom Accelerate loop (CPU, gradient accumulation 2,
``accelerator.clip_grad_norm_``, warmup + linear decay), run as a user runs it
(``accelerate_run.py`` in a subprocess) with three lines added: every step's scalars match
what the loop itself saw, the plan is the loop's own scheduler as Accelerate steps it, two
identical runs pass ``precalign compare``, and recording changes no loss, LR, grad norm or
parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")

from pytest_precalign.trace.training_record import read_run_record  # noqa: E402

from .framework_runs import compare, manifests, run_scripts  # noqa: E402

STEPS, MICRO, CLIP = 4, 2, 0.05


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("accelerate")
    common = ["--clip", str(CLIP), "--accumulate", str(MICRO), "--steps", str(STEPS)]
    seen = run_scripts(
        "accelerate_run.py",
        {"a": [*common, "--root", "a"], "b": [*common, "--root", "b"], "plain": common},
        out,
    )
    return out, seen


def test_recording_changes_no_loss_lr_grad_norm_or_parameter(runs: tuple[Path, dict[str, Any]]) -> None:
    _, seen = runs
    assert seen["a"] == seen["plain"]
    assert len(seen["a"]["micro_losses"]) == STEPS * MICRO


def test_every_step_recorded_as_the_loop_ran_it(runs: tuple[Path, dict[str, Any]]) -> None:
    out, seen = runs
    steps = manifests(out / "a")
    assert sorted(steps) == list(range(STEPS))
    for s, manifest in steps.items():
        scalars = read_run_record(manifest).scalars[s]
        assert scalars.micro_batches == MICRO
        losses = seen["a"]["micro_losses"][s * MICRO : (s + 1) * MICRO]
        assert scalars.loss == pytest.approx(sum(losses) / MICRO, rel=1e-7)
        assert scalars.grad_norm == seen["a"]["grad_norm"][s]  # what clip_grad_norm_ returned
        assert scalars.lr == (seen["a"]["lr"][s],)
        assert scalars.grad_norm is not None and scalars.grad_norm > CLIP
        assert scalars.clip_coef is not None and scalars.clip_coef < 1
        assert scalars.clip_coef == pytest.approx(CLIP / (scalars.grad_norm + 1e-6), rel=1e-5)
        assert scalars.skipped is False and scalars.update_norm is not None
        assert scalars.batch_hash is not None
    assert len({read_run_record(m).scalars[s].batch_hash for s, m in steps.items()}) == STEPS
    assert "initial_params" in steps[0]


def test_plan_is_the_loops_own_schedule(runs: tuple[Path, dict[str, Any]]) -> None:
    out, seen = runs
    settings = read_run_record(manifests(out / "a")[0]).settings
    assert settings is not None and settings.plan is not None
    plan = settings.plan
    assert (settings.trainer, settings.framework) == ("accelerate", "accelerate")
    assert [row[0] for row in plan.lr] == seen["a"]["lr"]
    assert (plan.clip_grad, plan.micro_batches, plan.loss_normalisation) == (
        CLIP,
        MICRO,
        "mean_of_micro_batch_means",
    )
    assert (plan.optimizer, plan.weight_decay, plan.precision) == ("adamw", (0.1,), "float32")
    assert plan.groups == (("0.weight", "0.bias", "2.weight", "2.bias"),)


def test_two_identical_accelerate_runs_pass_compare(runs: tuple[Path, dict[str, Any]]) -> None:
    out, _ = runs
    result = compare(out / "a", out / "b", "--report", str(out / "report"))
    assert result.returncode == 0, result.stdout + result.stderr
    report = (out / "report" / "report.json").read_text()
    assert '"passed": true' in report and '"steps_compared": 4' in report


def test_a_loop_that_does_not_clip(tmp_path: Path) -> None:
    """Without ``clip_grad_norm_`` the grad norm is the grads' just before the update, the clip
    coefficient 1; without ``total_steps`` there is no plan, the settings are still written."""
    import torch
    from accelerate import Accelerator

    from pytest_precalign import AccelerateSteps

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    steps = AccelerateSteps(tmp_path / "run", accelerator, model, optimizer, mode="scalars")
    norms, losses = [], []
    for s in range(3):
        x = torch.full((2, 3), float(s + 1))
        with accelerator.accumulate(model):
            steps.micro_batch(x)
            loss = model(x).pow(2).mean()
            losses.append(loss.item())
            steps.backward(loss)
            norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
            optimizer.step()
            optimizer.zero_grad()
    steps.close()
    scalars = steps.scalars
    assert sorted(scalars) == [0, 1, 2]
    for s in range(3):
        assert scalars[s].grad_norm == pytest.approx(norms[s], rel=1e-6)
        assert scalars[s].clip_coef == 1.0 and scalars[s].loss == pytest.approx(losses[s], rel=1e-7)
        assert scalars[s].lr == (0.1,) and scalars[s].micro_batches == 1
    settings = read_run_record(manifests(tmp_path / "run")[0]).settings
    assert settings is not None and settings.plan is None
    assert settings.arguments["clip_grad_norm"] is None
    assert settings.arguments["Accelerator"]["gradient_accumulation_steps"] == 1


def test_arguments_are_checked(tmp_path: Path) -> None:
    import torch
    from accelerate import Accelerator

    from pytest_precalign import AccelerateSteps
    from pytest_precalign.errors import ConfigError

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="total_steps= must be an integer >= 0, got -1"):
        AccelerateSteps(tmp_path, accelerator, model, optimizer, total_steps=-1)
    with pytest.raises(ConfigError, match="optimizer must be a torch optimizer .* got str"):
        AccelerateSteps(tmp_path, accelerator, model, "adam")


def test_a_loss_the_recording_did_not_see_is_named(tmp_path: Path) -> None:
    """A backward before ``steps.micro_batch``, and a step whose loss went through
    ``accelerator.backward`` instead of ``steps.backward``, each fail in one message rather
    than record a step without its loss."""
    import torch
    from accelerate import Accelerator

    from pytest_precalign import AccelerateSteps
    from pytest_precalign.errors import ConfigError

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.ones(2, 3)
    steps = AccelerateSteps(tmp_path / "a", accelerator, model, optimizer, mode="scalars")
    with pytest.raises(ConfigError, match=r"no micro-batch is open: call steps.micro_batch\(batch\)"):
        steps.backward(model(x).sum())
    steps.close()
    steps = AccelerateSteps(tmp_path / "b", accelerator, model, optimizer, mode="scalars")
    with accelerator.accumulate(model):
        steps.micro_batch(x)
        accelerator.backward(model(x).sum())
        with pytest.raises(ConfigError, match=r"step 0 updated the model, but no loss went through"):
            optimizer.step()
    steps.close()
    assert not (tmp_path / "b").exists()
