"""``PrecalignCallback`` records a real ``transformers.Trainer`` run (warmup, cosine to a
floor, clipping, weight decay, 2 micro-batches) in the Recorder's layout without subclassing
anything; the same loop written by hand and recorded with the ``Recorder`` gives the same
records and scalars; the Trainer callback writes each step into the ``StepSink`` it is handed
(the Recorder, or a case trainer's sink) in the protocol's order; recording changes no loss, LR or grad norm; used outside a Trainer it
says so in one message."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    Trainer,
    TrainerControl,
    TrainerState,
    TrainingArguments,
    get_scheduler,
)

from pytest_precalign import PrecalignCallback, Recorder
from pytest_precalign.errors import ConfigError
from pytest_precalign.steps.step_evidence import StepEvidence, batch_hash, group_settings, token_count
from pytest_precalign.trace.native_io import read_trace
from pytest_precalign.trace.step_scalars import StepScalars, scalars_of
from pytest_precalign.trace.training_record import TrainingSettings
from pytest_precalign.training.hf_callback import TrainerSteps
from pytest_precalign.vocabulary import RecordingMode

from .hf_user_run import model as _model  # the tiny Qwen2 of the user-run script

STEPS, ROWS, MICRO = 3, 4, 2


def _rows() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 128, (STEPS * ROWS, 8), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def _args(out: Path, **extra: Any) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=ROWS // MICRO,
        gradient_accumulation_steps=MICRO,
        learning_rate=0.01,
        weight_decay=0.1,
        max_grad_norm=1.0,
        warmup_steps=2,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr": 0.001},
        train_sampling_strategy="sequential",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        **extra,
    )


def _train(out: Path, callbacks: list[Any], **extra: Any) -> list[dict[str, float]]:
    trainer = Trainer(model=_model(), args=_args(out, **extra), train_dataset=_rows(), callbacks=callbacks)
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def _by_hand(root: Path) -> None:
    """What the Trainer does, written as a loop and recorded with the Recorder."""
    model = _model()
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=0.01
    )
    scheduler = get_scheduler(
        "cosine_with_min_lr", optimizer, 2, STEPS, scheduler_specific_kwargs={"min_lr": 0.001}
    )
    rows = _rows()
    params = list(model.parameters())
    evidence = StepEvidence(params)
    with Recorder(root, mode="stats") as rec:
        rec.record_initial_params(model)
        for step in range(STEPS):
            batch = rows[step * ROWS : (step + 1) * ROWS]
            micro = [
                {
                    k: torch.stack([r[k] for r in batch[m : m + ROWS // MICRO]])
                    for k in ("input_ids", "labels")
                }
                for m in range(0, ROWS, ROWS // MICRO)
            ]
            items = sum(int((m["labels"][:, 1:] != -100).sum()) for m in micro)
            rec.start(model)
            evidence.begin()
            total = torch.tensor(0.0)
            for part in micro:
                out = model(**part, num_items_in_batch=torch.tensor(items))
                rec.record_output("logits", out.logits)
                rec.record_output("loss", out.loss)
                out.loss.backward()
                total = total + out.loss.detach()
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
            evidence.grads_before_clip(norm=float(norm))
            torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm)
            evidence.grads_after_clip()
            lr, wd = group_settings(optimizer)
            optimizer.step()
            scheduler.step()
            model.zero_grad()
            rec.record_scalars(
                evidence.finish(
                    step,
                    loss=float(total),
                    lr=lr,
                    weight_decay=wd,
                    tokens=token_count(micro),
                    batch_hash=batch_hash(micro),
                    micro_batches=MICRO,
                    skipped=False,
                )
            )
            rec.stop()
            rec.step()


def _records(root: Path) -> dict[str, Any]:
    out = {}
    for folder in sorted(root.glob("step*/rank*")):
        trace = read_trace(folder)
        names = sorted((r.name, r.kind, r.phase, r.call) for r in trace.records)
        out[folder.relative_to(root).as_posix()] = (names, scalars_of(trace.manifest), trace.manifest)
    return out


def test_callback_and_recorder_by_hand_give_the_same_records(tmp_path: Path) -> None:
    callback = PrecalignCallback(tmp_path / "hf", mode="stats")
    sink = _Calls()  # the same callback handed a case trainer's sink, beside it in the same run
    _train(tmp_path / "out", [callback, TrainerSteps(sink)])
    assert sink.calls == _sink_calls()
    _by_hand(tmp_path / "hand")
    hf, hand = _records(tmp_path / "hf"), _records(tmp_path / "hand")
    assert sorted(hf) == [f"step{s}/rank0" for s in range(STEPS)] == sorted(hand)
    for folder in hf:
        hf_names, hf_scalars, hf_manifest = hf[folder]
        hand_names, hand_scalars, _ = hand[folder]
        assert hf_names == hand_names and any(n[0] == "loss" for n in hf_names)
        (step,) = hf_scalars
        a, b = hf_scalars[step], hand_scalars[step]
        assert (a.step, a.lr, a.weight_decay, a.tokens, a.batch_hash, a.micro_batches, a.zero_grads) == (
            b.step,
            b.lr,
            b.weight_decay,
            b.tokens,
            b.batch_hash,
            b.micro_batches,
            b.zero_grads,
        )
        for field in ("loss", "grad_norm", "clip_coef", "update_norm", "param_norm"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-5), field
    assert "initial_params" in hf["step0/rank0"][2] and "initial_params" not in hf["step1/rank0"][2]
    assert hf["step0/rank0"][1][0].lr == (0.0, 0.0)  # warmup from 0: the first update used LR 0


@pytest.mark.slow  # the user's path covers it: test_recorded_settings' hf / hf_scalars vs hf_bare
def test_recording_changes_no_loss_lr_or_grad_norm(tmp_path: Path) -> None:
    torch.use_deterministic_algorithms(True)
    try:
        bare = _train(tmp_path / "a", [], logging_steps=1)
        recorded = _train(
            tmp_path / "b", [PrecalignCallback(tmp_path / "rec", mode="stats")], logging_steps=1
        )
        scalars_only = _train(tmp_path / "c", [PrecalignCallback(tmp_path / "sc")], logging_steps=1)
    finally:
        torch.use_deterministic_algorithms(False)
    keys = ("loss", "learning_rate", "grad_norm")
    assert [[e[k] for k in keys] for e in bare] == [[e[k] for k in keys] for e in recorded]
    assert [[e[k] for k in keys] for e in bare] == [[e[k] for k in keys] for e in scalars_only]
    for root in ("rec", "sc"):  # both computed the plan from the run's own scheduler, in the run
        first = json.loads((tmp_path / root / "step0" / "rank0" / "manifest.json").read_text())
        assert len(first["training"]["plan"]["lr"]) == STEPS
    manifest = json.loads((tmp_path / "sc" / "step1" / "rank0" / "manifest.json").read_text())
    assert manifest["record_mode"] == "scalars" and manifest["scalars"]["1"]["loss"] == bare[1]["loss"]
    assert manifest["scalars"]["1"]["grad_norm"] == bare[1]["grad_norm"]


def test_callback_outside_a_trainer_is_one_message(tmp_path: Path) -> None:
    callback = PrecalignCallback(tmp_path / "x")
    with pytest.raises(ConfigError, match="it is a transformers.Trainer callback") as excinfo:
        callback.on_step_begin(_args(tmp_path), TrainerState(), TrainerControl())
    assert "\n" not in str(excinfo.value)
    with pytest.raises(ConfigError, match="on_train_begin got no model"):
        callback.on_train_begin(_args(tmp_path), TrainerState(), TrainerControl())


def _sink_calls() -> list[tuple[object, ...]]:
    """What ``TrainerSteps`` calls its sink with over the run, in the ``StepSink`` order."""
    outputs = [("output", kind, call) for call in range(MICRO) for kind in ("logits", "loss")]
    expected: list[tuple[object, ...]] = []
    for step in range(STEPS):
        first = [("initial",)] if step == 0 else []  # no settings: only PrecalignCallback makes them
        expected += [("seek", step), ("start",), *outputs, ("updated",), *first]
        expected += [("scalars", step), ("stop",), ("step",)]
    return [*expected, ("close", False)]


class _Calls:
    """A ``StepSink`` that notes what it is called with (the protocol's order is the test)."""

    mode: RecordingMode = "stats"  # (a structural StepSink: the protocol's every method)

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def seek(self, step: int) -> None:
        self.calls.append(("seek", step))

    def start(self, model: torch.nn.Module | Sequence[torch.nn.Module]) -> None:
        self.calls.append(("start",))

    def record_output(
        self, kind: str, tensor: torch.Tensor, *args: object, call: int | None = None, **kw: object
    ) -> None:
        self.calls.append(("output", kind, call))

    def write_settings(self, settings: TrainingSettings) -> None:
        self.calls.append(("settings",))

    def record_initial_params(self, summary: dict[str, dict[str, float]]) -> None:
        self.calls.append(("initial",))

    def record_scalars(self, scalars: StepScalars) -> None:
        self.calls.append(("scalars", scalars.step))

    def updated(self) -> None:
        self.calls.append(("updated",))

    def stop(self) -> None:
        self.calls.append(("stop",))

    def step(self) -> None:
        self.calls.append(("step",))

    def close(self, failed: bool = False) -> None:
        self.calls.append(("close", failed))


def test_a_recorders_output_takes_the_call_its_caller_counted(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    with Recorder(tmp_path, mode="stats") as rec:
        rec.start(model)
        rec.record_output("loss", model(torch.ones(1, 2)).sum(), call=3)
        rec.record_output("loss", model(torch.ones(1, 2)).sum())  # the next after the caller's
        rec.stop()
    calls = [r.call for r in read_trace(tmp_path / "step0" / "rank0").records if r.kind == "loss"]
    assert calls == [3, 4]
