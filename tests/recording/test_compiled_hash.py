"""Hash mode on a ``torch.compile``d model: the CRC is taken outside the compiled graph (it
crashed inside it: ``setStorage ... out of bounds``), and equals the eager model's."""

from __future__ import annotations

import pytest
import torch

from pytest_precalign.recording import HookRecorder


def _crcs(model: torch.nn.Module, x: torch.Tensor) -> dict[tuple[str, str, str], str]:
    model.zero_grad(set_to_none=True)
    recorder = HookRecorder(model, mode="hash", grads=True)
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
    compiled = _crcs(torch.compile(net, backend="aot_eager"), x)  # type: ignore[arg-type]
    assert len(eager) >= 6
    # The compiled wrapper's inner model (``_orig_mod``) is a module of its own: the eager
    # model's whole, which eager recording does not record as a module.
    assert {k: v for k, v in compiled.items() if k[0]} == eager
