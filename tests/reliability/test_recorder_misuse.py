"""The public Recorder after misuse: a forward that raises removes the step's hooks, its op
mode, its writer thread and its temporary folder at once; ``step()`` before ``stop()``, a
meta-device model, ``start(<a function>)``, a module name msprobe cannot store and a forward
on another thread at level op are each one clear ``RecorderError`` (a ``PrecalignError``),
never a raw error or silent zeros. Real torch modules, real threads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.errors import PrecalignError, RecorderError

torch = pytest.importorskip("torch")


class Boom(torch.nn.Module):
    def __init__(self, fail: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 2)
        self.fail = fail

    def forward(self, x: Any) -> Any:
        y = torch.relu(self.first(x)) * 2
        if self.fail:
            raise RuntimeError("the user's forward failed")
        return self.second(y)


def hooks(model: torch.nn.Module) -> int:
    modules = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    params = sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())
    return modules + params


def writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "precalign-tensor-writer"]


@pytest.mark.parametrize(("level", "mode"), [("module", "tensor"), ("op", "tensor"), ("mix", "stats")])
def test_a_forward_that_raises_removes_everything_the_step_added(
    tmp_path: Path, level: str, mode: str
) -> None:
    from pytest_precalign import Recorder

    model = Boom(fail=True)
    rec = Recorder(tmp_path / "run", level=level, mode=mode)
    rec.start(model)
    assert hooks(model) > 0
    with pytest.raises(RuntimeError, match="the user's forward failed"):
        model(torch.ones(3, 4))
    assert hooks(model) == 0 and not rec.recording_now
    assert torch._C._len_torch_function_stack() == 0  # the op mode is off torch's stack
    assert writers() == [] and list(tmp_path.rglob("*.tmp")) == []
    assert rec.stop() is None  # nothing of the failed step is written
    model.fail = False
    rec.start(model)  # the next step records only its own calls
    torch.ones(2).add(1)  # an op outside the model is not one of its records
    model(torch.ones(3, 4)).sum().backward()
    folder = rec.stop()
    assert folder is not None and hooks(model) == 0
    from pytest_precalign.trace.native_io import read_trace

    names = {r.name for r in read_trace(folder).records}
    assert names and all(n.startswith(("first", "second", "Torch.", "Tensor.", "Functional.")) for n in names)
    assert not any(n in ("Tensor.add", "Torch.ones") for n in names)


@pytest.mark.parametrize("mode", ["stats", "tensor"])
def test_step_before_stop_is_one_message_and_the_step_is_kept(tmp_path: Path, mode: str) -> None:
    from pytest_precalign import Recorder
    from pytest_precalign.trace.native_io import read_trace

    model = Boom(fail=False)
    rec = Recorder(tmp_path / "run", mode=mode)
    rec.start(model)
    model(torch.ones(3, 4)).sum().backward()
    with pytest.raises(RecorderError) as excinfo:
        rec.step()
    assert str(excinfo.value) == (
        "Recorder.step: step 0 is still being recorded: call stop() first (it writes step0/), then step()"
    )
    assert rec.current_step == 0 and rec.recording_now
    folder = rec.stop()
    rec.step()
    assert folder == tmp_path / "run" / "step0" / "rank0" and rec.current_step == 1
    trace = read_trace(folder)
    assert trace.manifest["step"] == 0 and {r.step for r in trace.records} == {0}
    assert any(r.kind == "activation" for r in trace.records)


def test_a_meta_device_model_is_refused_at_start(tmp_path: Path) -> None:
    from pytest_precalign import Recorder

    with torch.device("meta"):
        model = Boom(fail=False)
    rec = Recorder(tmp_path / "run")
    with pytest.raises(RecorderError) as excinfo:
        rec.start(model)
    assert str(excinfo.value).startswith(
        "Recorder.start: the model's first.weight is on the meta device: it holds no values to record"
    )
    assert hooks(model) == 0 and not rec.recording_now and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("given", "what"),
    [(lambda x: x, "function"), (None, "NoneType"), ([], "an empty list"), ("model", "str")],
)
def test_start_with_something_else_than_modules_is_one_message(tmp_path: Path, given: Any, what: str) -> None:
    from pytest_precalign import Recorder

    rec = Recorder(tmp_path / "run")
    with pytest.raises(RecorderError) as excinfo:
        rec.start(given)
    message = str(excinfo.value)
    assert message.startswith(
        "Recorder.start: expected an nn.Module or a non-empty list of nn.Module chunks, got "
    )
    assert what in message and not rec.recording_now and writers() == []


def test_a_module_name_msprobe_cannot_store_is_refused_at_start(tmp_path: Path) -> None:
    from pytest_precalign import Recorder

    model = Boom(fail=False)
    model.add_module("a/b", torch.nn.Linear(2, 2))
    rec = Recorder(tmp_path / "run", format="msprobe", mode="tensor")
    with pytest.raises(RecorderError) as excinfo:
        rec.start(model)
    assert str(excinfo.value) == (
        "Recorder.start: module 'a/b' cannot be stored in msprobe's format (its names become file "
        "names: no '/', '\\\\' or NUL); use format='native' or rename the module"
    )
    assert hooks(model) == 0
    native = Recorder(tmp_path / "native", mode="tensor")  # the native format keeps any name
    native.start(model)
    model(torch.ones(3, 4)).sum().backward()
    assert native.stop() is not None


@pytest.mark.parametrize("level", ["op", "mix"])
def test_a_forward_on_another_thread_at_level_op_is_one_message(tmp_path: Path, level: str) -> None:
    from pytest_precalign import Recorder

    model = Boom(fail=False)
    rec = Recorder(tmp_path / "run", level=level)
    rec.start(model)
    raised: list[BaseException] = []

    def forward() -> None:
        try:
            model(torch.ones(3, 4))
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=forward)
    worker.start()
    worker.join()
    assert len(raised) == 1 and isinstance(raised[0], RecorderError) and isinstance(raised[0], PrecalignError)
    assert str(raised[0]).startswith(
        f"Recorder at level '{level}': the forward ran on thread {worker.name!r}, but torch calls are seen "
        "only on the thread that called start()"
    )
    assert rec.stop() is None  # the step was given up: nothing written, every hook removed
    assert hooks(model) == 0 and not (tmp_path / "run").exists()
