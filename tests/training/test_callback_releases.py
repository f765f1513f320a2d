"""``PrecalignCallback`` writes the plan, the per-step LR and weight decay on every transformers
release the ``hf`` extra allows: from 4.49.0 the Trainer hands callbacks ``optimizer=None`` and
``lr_scheduler=None`` (transformers issue #38181; still so in 4.53), and the callback takes them
from the Trainer. Each release a user's script (``hf_user_run.py``) runs in a venv of its own,
in a subprocess; .ci/run creates the venvs (``.venv-transformers-4.49``, ``-4.52``, ``-4.53``),
and without one the test fails on CI and is skipped elsewhere, with the command that creates it.
The newest release is this environment's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

from .hf_user_run import STEPS

RELEASES = {"4.49": "4.49.0", "4.52": "4.52.4", "4.53": "4.53.0"}


def _create(venv: str, version: str) -> str:
    return (
        f"python3.11 -m venv {venv} && {venv}/bin/pip install torch==2.13.0 && "
        f'{venv}/bin/pip install transformers=={version} "accelerate>=1.1" && {venv}/bin/pip install -e .'
    )


def _python(release: str) -> Path:
    if release == "newest":
        return Path(sys.executable)
    venv = f".venv-transformers-{release}"
    python = REPO / venv / "bin" / "python"
    if not python.exists():
        message = f"{REPO / venv} is missing; create it from the repository root with: {_create(venv, RELEASES[release])}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


# 4.49 (the first release that hands callbacks None) and 4.53 run in the default suite; 4.52
# (between them, the same Trainer code) and the newest (this environment's: the other callback
# tests run it) are slow.
@pytest.mark.parametrize(
    "release",
    [
        "4.49",
        pytest.param("4.52", marks=pytest.mark.slow),
        "4.53",
        pytest.param("newest", marks=pytest.mark.slow),
    ],
)
def test_callback_records_plan_lr_and_weight_decay_on_every_release(release: str, tmp_path: Path) -> None:
    python = _python(release)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}  # this tree's code
    done = subprocess.run(
        [
            str(python),
            str(REPO / "tests" / "training" / "hf_user_run.py"),
            str(tmp_path),
            "run=--mode scalars",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "got no optimizer" not in done.stderr
    rec = tmp_path / "run" / "rec"
    manifests = [json.loads((rec / f"step{s}" / "rank0" / "manifest.json").read_text()) for s in range(STEPS)]
    training = manifests[0]["training"]
    version = training["framework"]["version"]
    if release != "newest":
        assert version == RELEASES[release], f"{python}: transformers {version}"
    assert "plan_missing" not in training
    plan = training["plan"]
    assert plan is not None, f"transformers {version}: no plan written"
    assert plan["weight_decay"] == [0.1, 0.0]  # decayed weights, then biases and norms
    assert len(plan["lr"]) == STEPS
    logged = json.loads((tmp_path / "run" / "logs.json").read_text())  # [loss, lr, grad_norm] per step
    for step, manifest in enumerate(manifests):
        scalars = manifest["scalars"][str(step)]
        assert scalars["lr"] == plan["lr"][step], f"step {step}"
        assert scalars["weight_decay"] == [0.1, 0.0]
        assert scalars["loss"] == pytest.approx(logged[step][0], abs=1e-4)


def _loop(root: Path, with_optimizer: bool) -> None:
    """A user's own loop that drives ``PrecalignCallback`` through transformers' own
    ``CallbackHandler`` (as loops reusing HF callbacks do): two steps, the optimizer handed to
    the callbacks or not (and no Trainer on the stack to take it from)."""
    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    from pytest_precalign import PrecalignCallback

    from .hf_user_run import model as tiny_model

    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    given = optimizer if with_optimizer else None
    callbacks = [DefaultFlowCallback(), PrecalignCallback(root)]
    handler = CallbackHandler(callbacks, model, None, given, None)
    args = TrainingArguments(output_dir=str(root / "out"), max_steps=2, report_to=[], use_cpu=True)
    state, control = TrainerState(max_steps=2), TrainerControl()
    handler.on_train_begin(args, state, control)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        handler.on_step_begin(args, state, control)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        handler.on_pre_optimizer_step(args, state, control)
        optimizer.step()
        handler.on_optimizer_step(args, state, control)
        optimizer.zero_grad()
        state.global_step += 1
        handler.on_step_end(args, state, control)
        handler.on_log(args, state, control, logs={"loss": loss.detach().item(), "grad_norm": 1.0})
    handler.on_train_end(args, state, control)


def test_a_recording_without_its_plan_says_so_when_recorded_and_first_in_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_precalign.cli import main

    _loop(tmp_path / "with_plan", with_optimizer=True)
    with pytest.warns(RuntimeWarning, match="PrecalignCallback got no optimizer from the Trainer") as seen:
        _loop(tmp_path / "no_plan", with_optimizer=False)
    assert len(seen) == 1
    manifest = json.loads((tmp_path / "no_plan" / "step0" / "rank0" / "manifest.json").read_text())
    assert manifest["training"]["plan"] is None
    assert "no plan, LR or weight decay was recorded" in manifest["training"]["plan_missing"]
    assert main(["compare", str(tmp_path / "with_plan"), str(tmp_path / "no_plan")]) == 1
    out = capsys.readouterr().out
    training = [
        line.strip() for line in out.splitlines() if line.strip().startswith(("Runs do", "Warning", "Step "))
    ]
    version = manifest["training"]["framework"]["version"]
    assert training[0] == (
        f"Warning: the candidate's recording has no training plan: PrecalignCallback got no optimizer "
        f"from the Trainer (transformers {version}: neither the event's arguments nor the calling Trainer "
        "had one), so no plan, LR or weight decay was recorded"
    ), out
    assert (
        "Runs do not line up: training plan recorded by the baseline only: the settings (contract) are "
        "not checked before step 0"
    ) in training, out
