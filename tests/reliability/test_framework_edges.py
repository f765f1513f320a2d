"""Issue #47, item 3: the framework surfaces' edges. A Lightning ``training_step`` or an
Accelerate loop that raises inside step k leaves a root the compare says stopped inside step k
(before: Lightning's ``on_exception`` and ``AccelerateSteps.__exit__`` closed the step as if it
ended; Accelerate wrote it as a skipped step); Lightning's two optimizers and
``ReduceLROnPlateau``; the batch hash on int32 ids, bool masks, ignored labels and row order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_precalign.cli import main
from pytest_precalign.steps.step_evidence import batch_hash, token_count

STOPPED = "the run stopped inside step 1"
LIGHTNING_WARNINGS = (  # Lightning's own, on this torch
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
)


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()  # what the runs printed (Lightning's log lines)
    code = main(["compare", str(a), str(b)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.out + captured.err


# -- the batch hash ---------------------------------------------------------------------------

IDS = torch.tensor([[0, 0, 5, 6, 7], [9, 10, 11, 12, 13]])  # row 0 left-padded
MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
LABELS = torch.tensor([[-100, -100, 5, 6, 7], [-100, 10, 11, 12, 13]])  # row 1's prompt ignored


def _batch(**changes: Any) -> dict[str, torch.Tensor]:
    return {"input_ids": IDS, "attention_mask": MASK, "labels": LABELS, **changes}


def test_int32_ids_and_a_bool_mask_hash_as_int64_and_an_int_mask() -> None:
    base = batch_hash([_batch()])
    assert batch_hash([_batch(input_ids=IDS.to(torch.int32), labels=LABELS.to(torch.int32))]) == base
    assert batch_hash([_batch(attention_mask=MASK.bool())]) == base
    assert token_count([_batch(attention_mask=MASK.bool())]) == token_count([_batch()]) == 7


def test_left_padding_to_another_length_hashes_the_same() -> None:
    wider = {
        k: torch.cat([torch.full((2, 2), 0 if k != "labels" else -100), v], 1) for k, v in _batch().items()
    }
    assert batch_hash([wider]) == batch_hash([_batch()])


def test_an_ignored_label_and_the_row_order_are_data() -> None:
    base = batch_hash([_batch()])
    unignored = LABELS.clone()
    unignored[1, 0] = 9  # the prompt token now counted by the loss
    assert batch_hash([_batch(labels=unignored)]) != base
    swapped = {k: v.flip(0) for k, v in _batch().items()}
    assert batch_hash([swapped]) != base


# -- Lightning ---------------------------------------------------------------------------------


def _lightning(root: Path, kind: str) -> BaseException | None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from pytest_precalign import PrecalignLightningCallback

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net, self.other = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            if kind == "raise" and index == 1:
                raise RuntimeError("the user's training_step failed in step 1")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x) + self.other(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            if kind == "two":
                return [
                    torch.optim.SGD(self.net.parameters(), lr=0.1),
                    torch.optim.SGD(self.other.parameters()),
                ]
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            if kind == "plateau":
                plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
                return {
                    "optimizer": optimizer,
                    "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss"},
                }
            return optimizer

    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g))
    quiet: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
    }
    quiet.update(enable_progress_bar=False, enable_model_summary=False, max_steps=3)
    callback = PrecalignLightningCallback(root, mode="stats")
    try:
        L.Trainer(callbacks=[callback], **quiet).fit(Net(), DataLoader(data, batch_size=2))
    except Exception as exc:  # what the user's run raised
        return exc
    return None


@pytest.mark.slow
@LIGHTNING_WARNINGS[0]
@LIGHTNING_WARNINGS[1]
def test_a_lightning_training_step_that_raises_leaves_a_run_stopped_inside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _lightning(tmp_path / "full", "plain") is None
    raised = _lightning(tmp_path / "run", "raise")
    assert isinstance(raised, RuntimeError) and "failed in step 1" in str(raised)
    assert [p.name for p in (tmp_path / "run" / "step1").iterdir()] == [".rank0.in-step"]
    code, out = _compare(tmp_path / "full", tmp_path / "run", capsys)
    assert code == 1 and STOPPED in out, out


@pytest.mark.slow
@LIGHTNING_WARNINGS[0]
@LIGHTNING_WARNINGS[1]
def test_lightning_two_optimizers_are_lightnings_own_one_message_and_nothing_recorded(tmp_path: Path) -> None:
    raised = _lightning(tmp_path / "run", "two")
    assert isinstance(raised, RuntimeError) and "multiple optimizers" in str(raised)
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("manifest.json"))


@pytest.mark.slow
@LIGHTNING_WARNINGS[0]
@LIGHTNING_WARNINGS[1]
def test_lightning_reduce_lr_on_plateau_records_its_steps_and_compares_as_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plateau scheduler has no plan (its LRs depend on the losses); the run's steps are
    recorded and two runs compare aligned."""
    for name in ("a", "b"):
        assert _lightning(tmp_path / name, "plateau") is None
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["step0", "step1", "step2"]
    code, out = _compare(tmp_path / "a", tmp_path / "b", capsys)
    assert code == 0, out


# -- Accelerate ---------------------------------------------------------------------------------


def _accelerate(root: Path, raise_in: int | None, steps: int = 3) -> None:
    from accelerate import Accelerator

    from pytest_precalign import AccelerateSteps

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    with AccelerateSteps(root, accelerator, model, optimizer, mode="stats") as recorded:
        for s in range(steps):
            x = torch.full((2, 3), float(s + 1))
            with accelerator.accumulate(model):
                recorded.micro_batch(x)
                recorded.backward(model(x).pow(2).mean())
                if s == raise_in:
                    raise RuntimeError(f"the loop failed in step {s}")
                optimizer.step()
                optimizer.zero_grad()


@pytest.mark.slow
def test_an_accelerate_loop_that_raises_inside_a_step_is_told_stopped_inside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("accelerate")
    _accelerate(tmp_path / "full", None)
    with pytest.raises(RuntimeError, match="failed in step 1"):
        _accelerate(tmp_path / "run", 1)
    assert [p.name for p in (tmp_path / "run" / "step1").iterdir()] == [".rank0.in-step"]
    code, out = _compare(tmp_path / "full", tmp_path / "run", capsys)
    assert code == 1 and STOPPED in out, out


def _accelerate_loop(
    root: Path,
    micro: int,
    accumulate: int,
    *,
    start: int = 0,
    stop_in: int | None = None,
    continues: Path | None = None,
) -> Any:
    """``micro`` micro-batches through Accelerate's prepared DataLoader (it closes the last,
    uneven step), ``accumulate`` per step; ``start``: resumed there from the checkpoint of the
    state after ``start`` steps (made here by training them unrecorded); ``stop_in``: the loop
    raises inside that step; ``continues``: the root of the run's first part."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    from pytest_precalign import AccelerateSteps

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = torch.randn(micro, 3, generator=torch.Generator().manual_seed(4))
    loader = DataLoader(TensorDataset(xs), batch_size=1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    recorded = AccelerateSteps(
        root, accelerator, model, optimizer, mode="stats", start_step=start, continues=continues
    )
    for index, (x,) in enumerate(loader):
        step = index // accumulate
        with accelerator.accumulate(model):
            if step >= start:
                recorded.micro_batch(x)
            loss = model(x).pow(2).mean()
            (recorded.backward if step >= start else accelerator.backward)(loss)
            if step == stop_in:
                recorded.close(failed=True)
                return None
            optimizer.step()
            optimizer.zero_grad()
    recorded.close()
    return recorded.scalars


@pytest.mark.slow
def test_accelerate_an_uneven_last_step_is_recorded_with_its_one_micro_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("accelerate")
    scalars = _accelerate_loop(tmp_path / "a", 5, 2)
    assert sorted(scalars) == [0, 1, 2] and [scalars[s].micro_batches for s in range(3)] == [2, 2, 1]
    _accelerate_loop(tmp_path / "b", 5, 2)
    assert _compare(tmp_path / "a", tmp_path / "b", capsys)[0] == 0


@pytest.mark.slow
@pytest.mark.parametrize("into", ["its root", "a new root"])
def test_accelerate_a_run_resumed_compares_as_the_full_run(
    into: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped inside step 2, resumed at step 2 (``start_step=2``) into the same root, or into
    a new one told where its first part is (``continues=``): one run."""
    pytest.importorskip("accelerate")
    _accelerate_loop(tmp_path / "full", 8, 2)
    _accelerate_loop(tmp_path / "run", 8, 2, stop_in=2)
    assert [p.name for p in (tmp_path / "run" / "step2").iterdir()] == [".rank0.in-step"]
    again = tmp_path / ("run" if into == "its root" else "rest")
    _accelerate_loop(again, 8, 2, start=2, continues=None if into == "its root" else tmp_path / "run")
    held = ["step0", "step1", "step2", "step3"] if into == "its root" else ["step2", "step3"]
    assert sorted(p.name for p in again.iterdir()) == held
    code, out = _compare(tmp_path / "full", again, capsys)
    assert code == 0, out


class _Resumable:
    """A Lightning run of 2 steps an epoch (4 rows, 2 a batch, no shuffling), so a checkpoint
    at an epoch's end resumes on the very batches the full run saw."""

    @staticmethod
    def fit(root: Path, max_steps: int, ckpt: Path | None = None, save: Path | None = None) -> None:
        """``save``: the run stops after step 2 (of its planned ``max_steps``) and checkpoints."""
        import lightning as L
        from torch.utils.data import DataLoader, TensorDataset

        from pytest_precalign import PrecalignLightningCallback

        class Net(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(0)
                self.net = torch.nn.Linear(3, 1)

            def training_step(self, batch: Any, index: int) -> Any:
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

        g = torch.Generator().manual_seed(2)
        data = TensorDataset(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g))
        quiet: dict[str, Any] = {
            "accelerator": "cpu",
            "devices": 1,
            "logger": False,
            "enable_checkpointing": False,
        }
        quiet.update(enable_progress_bar=False, enable_model_summary=False, max_steps=max_steps)

        class StopAt2(L.Callback):
            def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
                trainer.should_stop = trainer.should_stop or (save is not None and trainer.global_step == 2)

        callbacks = [PrecalignLightningCallback(root, mode="stats"), StopAt2()]
        trainer = L.Trainer(callbacks=callbacks, **quiet)
        trainer.fit(Net(), DataLoader(data, batch_size=2), ckpt_path=str(ckpt) if ckpt else None)
        if save is not None:
            trainer.save_checkpoint(str(save))


@pytest.mark.slow
@LIGHTNING_WARNINGS[0]
@LIGHTNING_WARNINGS[1]
@pytest.mark.parametrize("into", ["the same root", "a new root"])
def test_lightning_resumed_from_a_checkpoint_continues_its_recording(
    into: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _Resumable.fit(tmp_path / "full", 4)
    _Resumable.fit(tmp_path / "run", 4, save=tmp_path / "step2.ckpt")
    again = tmp_path / ("run" if into == "the same root" else "rest")
    _Resumable.fit(again, 4, ckpt=tmp_path / "step2.ckpt")
    held = ["step0", "step1", "step2", "step3"] if into == "the same root" else ["step2", "step3"]
    assert sorted(p.name for p in again.iterdir()) == held
    if into == "a new root":  # it points to its first part (the callback's checkpoint state)
        manifest = json.loads((again / "step2" / "rank0" / "manifest.json").read_text())
        assert manifest["continues"]["root"] == "../run" and manifest["continues"]["step"] == 1
    code, out = _compare(tmp_path / "full", again, capsys)  # one run of 4 steps either way
    # Lightning 2.6's resume from a checkpoint saved where the run stopped feeds step 3 the
    # batch of step 2 again (both steps' batch hashes are the full run's step 2's): the
    # compare names step 3's data as the origin, with that evidence
    assert code == 1 and "step 3 diverged first: data (batch)" in out, out
    assert "more than one run" not in out and "stopped inside" not in out and "baseline only" not in out


@pytest.mark.slow
@LIGHTNING_WARNINGS[0]
@LIGHTNING_WARNINGS[1]
def test_lightning_manual_optimization_is_one_message_before_it_trains(tmp_path: Path) -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from pytest_precalign import PrecalignLightningCallback
    from pytest_precalign.training.lightning_callback import LightningUsageError

    class Manual(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 1)
            self.automatic_optimization = False

        def training_step(self, batch: Any, index: int) -> Any:
            optimizer = self.optimizers()
            loss = self.net(batch[0]).sum()
            self.manual_backward(loss)
            optimizer.step()
            optimizer.zero_grad()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.ones(4, 3)), batch_size=2)
    quiet: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
    }
    quiet.update(enable_progress_bar=False, enable_model_summary=False, max_steps=2)
    module = Manual()
    before = [p.detach().clone() for p in module.parameters()]
    trainer = L.Trainer(callbacks=[PrecalignLightningCallback(tmp_path / "run")], **quiet)
    with pytest.raises(LightningUsageError, match="manual optimization"):
        trainer.fit(module, data)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))  # not trained
    assert not list(tmp_path.rglob("manifest.json"))


@pytest.mark.slow
def test_accelerate_a_direct_accelerator_backward_is_one_message_and_no_step(tmp_path: Path) -> None:
    """The loop calls ``accelerator.backward(loss)`` instead of ``steps.backward(loss)``: the
    update is refused in one message (a step without its loss is never recorded)."""
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from pytest_precalign import AccelerateSteps
    from pytest_precalign.errors import ConfigError

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    steps = AccelerateSteps(tmp_path / "run", accelerator, model, optimizer, mode="stats")
    with accelerator.accumulate(model):
        steps.micro_batch(torch.ones(2, 3))
        accelerator.backward(model(torch.ones(2, 3)).sum())
        with pytest.raises(
            ConfigError, match=r"step 0 updated the model, but no loss went through steps.backward"
        ):
            optimizer.step()
    steps.close()
    assert not list(tmp_path.rglob("manifest.json"))
