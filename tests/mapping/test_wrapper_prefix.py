"""``precalign compare`` of two recordings of one model where one side recorded it inside a
wrapper (a LightningModule's ``model`` attribute, DDP's ``module``): the constant prefix is
found and taken off, in one line that says so and how to record without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign import Recorder
from pytest_precalign.cli import main
from pytest_precalign.mapping.wrapper_prefix import wrapper_prefix


class Wrapper(torch.nn.Module):
    """A user's wrapper holding the model as an attribute, as a LightningModule does."""

    def __init__(self, attribute: str, inner: torch.nn.Module) -> None:
        super().__init__()
        self.add_module(attribute, inner)
        self.attribute = attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = getattr(self, self.attribute)(x)
        return out


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 4),
    )


def _record(root: Path, model: torch.nn.Module, scale: float = 1.0) -> Path:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    rec = Recorder(root, mode="stats")
    rec.start(model)
    loss = (model(x) * scale).square().mean()
    loss.backward()
    rec.record_output("loss", loss)
    rec.stop()
    rec.step()
    rec.close()
    return root


@pytest.mark.parametrize("attribute", ["model", "module"])
def test_a_wrapper_prefix_is_found_and_taken_off_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], attribute: str
) -> None:
    plain = _record(tmp_path / "plain", _net())
    wrapped = _record(tmp_path / "wrapped", Wrapper(attribute, _net()))
    assert main(["compare", str(plain), str(wrapped)]) == 0
    out = capsys.readouterr().out
    assert (
        f"names: every candidate name is '{attribute}.' + the baseline's (a wrapper): compared with "
        f"'{attribute}.' taken off the candidate's names; to pair them without it, record the unwrapped "
        "model, or pass --mapping"
    ) in out, out
    assert "nothing compared" not in out
    # the other way round, and a real difference is still found through the prefix
    broken = _record(tmp_path / "broken", Wrapper(attribute, _net()), scale=1.5)
    assert main(["compare", str(broken), str(plain)]) == 1
    out = capsys.readouterr().out
    assert f"every baseline name is '{attribute}.' + the candidate's" in out, out


def test_names_that_pair_already_or_share_no_prefix_are_left_alone() -> None:
    names = ["model.layers.0.mlp", "model.layers.1.mlp", "lm_head"]
    assert wrapper_prefix(names, names) is None
    assert wrapper_prefix(names, ["encoder.block.0", "decoder.block.0"]) is None
    assert wrapper_prefix(names, ["model." + n for n in names]) == ("candidate", "model.")
    assert wrapper_prefix(["_orig_mod." + n for n in names], names) == ("baseline", "_orig_mod.")


def _scalars_run(root: Path, model: torch.nn.Module, loss: float) -> Path:
    """Per-step scalars and the initial parameters only (the callbacks' default scalars mode)."""
    rec = Recorder(root, mode="scalars")
    rec.record_initial_params(model)
    rec.start(model)
    rec.record_scalars(loss=loss, grad_norm=1.0)
    rec.stop()
    rec.step()
    rec.close()
    return root


def test_scalars_only_recordings_pair_their_parameter_names_through_the_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = _scalars_run(tmp_path / "plain", _net(), 2.0)
    wrapped = _scalars_run(tmp_path / "wrapped", Wrapper("model", _net()), 2.0)
    assert main(["compare", str(plain), str(wrapped)]) == 0, capsys.readouterr().out
    assert "every candidate name is 'model.' + the baseline's" in capsys.readouterr().out
