"""Hash mode on a ``torch.compile``d model: the CRC is taken outside the compiled graph (it
crashed inside it: ``setStorage ... out of bounds``), and equals the eager model's."""

from __future__ import annotations

import pytest
import torch

from pytest_precalign.recording import HookRecorder


def _crcs(model: torch.nn.Module, x: torch.Tensor, compiled: bool = False) -> dict[tuple[str, str, str], str]:
    model.zero_grad(set_to_none=True)
    recorder = HookRecorder(model, mode="hash", grads=True)
    if compiled:  # hash mode reads real tensors: its hooks split the graph, and it says so in one line
        with pytest.warns(UserWarning, match="outside the compiled graph") as said, recorder:
            model(x).sum().backward()
        assert len(said) == 1
        assert recorder.trace({}).manifest["compiled"]["stats"] == "outside the graph"
    else:
        with recorder:
            model(x).sum().backward()
    return {
        (r.name.removeprefix("_orig_mod.").removeprefix("_orig_mod"), r.kind, r.slot): str(r.crc32)
        for r in recorder.trace({}).records
        if r.kind in ("input", "activation")
    }


# dynamo, tracing the model, touches .grad of non-leaf tensors and warns (torch's, not ours)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_hash_mode_on_a_compiled_model_equals_the_eager_hashes() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    eager = _crcs(net, x)
    compiled = _crcs(torch.compile(net, backend="aot_eager"), x, compiled=True)  # type: ignore[arg-type]
    assert len(eager) >= 6
    assert compiled == eager  # the model inside the wrapper is recorded: no ``_orig_mod`` records
