"""The case trainers as one family: every registered trainer's driver module exposes a
``TRAINER`` with the protocol's methods (``run/trainers``), the launchable ones the rank's
too; the one step skeleton every trainer runs through (the recorder's step, the seed of each
step, the step replay's boundary, the parameter records after the update); and no trainer
name compared as a string outside the registry."""

from __future__ import annotations

import inspect
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_precalign.config.specs import CaseSpec, Models, ModelSpec, RecordSpec, TrainingSpec
from pytest_precalign.errors import CaseError
from pytest_precalign.recording import HookRecorder
from pytest_precalign.run.launch import run_launched
from pytest_precalign.run.side import run_side
from pytest_precalign.run.step_boundary import Boundary
from pytest_precalign.run.trainers import CaseTrainer, LaunchedTrainer, case_trainer, launched_trainer
from pytest_precalign.run.trainers.skeleton import StepSkeleton
from pytest_precalign.sources import LoadedModel
from pytest_precalign.sources.inputs import CaseInputs
from pytest_precalign.steps.spec import OptimizerSpec, SidesTraining
from pytest_precalign.steps.trainer_registry import TRAINERS, TrainerInfo, trainer_info, trainer_names
from pytest_precalign.trace.training_record import RunRecord

SRC = Path(__file__).resolve().parents[2] / "src" / "pytest_precalign"
REGISTRY = SRC / "training" / "trainer_registry.py"


def _methods(protocol: type) -> dict[str, list[str]]:
    own = {"__init__", "__class_getitem__", "__init_subclass__", "__subclasshook__"}
    return {
        name: list(inspect.signature(member).parameters)
        for name, member in vars(protocol).items()
        if inspect.isfunction(member) and name not in own
    }


@pytest.mark.parametrize("name", trainer_names())
def test_every_registered_trainer_implements_the_protocol(name: str) -> None:
    trainer = case_trainer(name)
    wanted = _methods(CaseTrainer)
    assert set(wanted) == {"plan", "train"}
    if trainer_info(name).launchable:
        wanted |= _methods(LaunchedTrainer)
        assert launched_trainer(name) is trainer
    else:
        with pytest.raises(ValueError, match="cannot train a launched side"):
            launched_trainer(name)
    for method, parameters in wanted.items():
        own = getattr(trainer, method)
        assert ["self", *inspect.signature(own).parameters] == parameters, (name, method)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _train(
    steps: StepSkeleton, module: _Net, optimizer: torch.optim.Optimizer, count: int
) -> dict[int, float]:
    """A trainer's loop through the skeleton; what each step's RNG drew first."""
    drawn = {}
    for step in steps.steps(count, module, lambda: optimizer):
        drawn[step] = float(torch.rand(()))
        optimizer.zero_grad()
        module(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        steps.updated()
    return drawn


def _expected_draw(seed: int) -> float:
    torch.manual_seed(seed)
    return float(torch.rand(()))


def test_the_skeleton_seeds_each_step_and_records_params_after_each_update() -> None:
    torch.manual_seed(0)
    module = _Net()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    recorder = HookRecorder(module, mode="tensor", grads=True)
    with recorder:
        drawn = _train(StepSkeleton(recorder, 7), module, optimizer, 3)
    assert drawn == {step: _expected_draw(7 + step) for step in range(3)}
    trace = recorder.trace({})
    params = {(r.name, r.step) for r in trace.records if r.kind == "param"}
    assert params == {(name, step) for name in ("fc.weight", "fc.bias") for step in range(3)}
    weight = next(r for r in trace.records if r.kind == "param" and r.name == "fc.weight" and r.step == 2)
    assert torch.equal(trace.tensors[weight.tensor_key], module.fc.weight.detach())  # after the update


def test_the_boundary_runs_earlier_steps_quiet_calls_at_once_and_stops_after_it() -> None:
    torch.manual_seed(0)
    module = _Net()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    calls: list[tuple[int, Any, Any]] = []
    recorder = HookRecorder(module, mode="tensor", grads=True)
    boundary = Boundary(2, lambda m, o: calls.append((recorder.step, m, o)))
    with recorder:
        drawn = _train(StepSkeleton(recorder, 7, boundary), module, optimizer, 5)
    assert sorted(drawn) == [0, 1, 2]  # past the boundary: not run
    assert drawn == {step: _expected_draw(7 + step) for step in range(3)}
    assert calls == [(2, module, optimizer)]  # where step 2 starts, handed the optimizer
    steps_recorded = {r.step for r in recorder.trace({}).records}
    assert steps_recorded == {2}  # steps 0 and 1 ran with the recorder paused


def test_the_optimizer_is_asked_for_only_at_the_boundarys_step() -> None:
    module = _Net()
    asked = []

    def optimizer() -> None:
        asked.append(True)

    for _ in StepSkeleton(None, 0).steps(3, module, optimizer):
        pass
    assert asked == []  # a trainer whose optimizer the boundary cannot take still trains
    for _ in StepSkeleton(None, 0, Boundary(1, lambda m, o: None)).steps(3, module, optimizer):
        pass
    assert asked == [True]


class _Forgetful:
    """A trainer that trains but writes no run record (a plan key left out, e.g.)."""

    def plan(self, model: Any, spec: Any, data: Any, case: Any, seed: int) -> None:
        return None

    def train(self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton) -> RunRecord:
        optimizer = torch.optim.SGD(model.module.parameters(), lr=0.1)
        for _ in steps.steps(case.steps, model.module, lambda: optimizer):
            optimizer.zero_grad()
            model.module(torch.ones(1, 3)).sum().backward()
            optimizer.step()
            steps.updated()
        return RunRecord()


TRAINER = _Forgetful()  # this module as a registered trainer's driver


@pytest.fixture
def forgetful(monkeypatch: pytest.MonkeyPatch) -> CaseSpec:
    """This module's ``TRAINER`` registered by one registry line (not launchable, no
    isolation), and a case whose baseline it trains."""
    info = TrainerInfo("forgetful", "a forgetful loop", ("factory",), __name__)
    monkeypatch.setitem(TRAINERS, info.name, info)
    return CaseSpec(
        name="c", sides=Models("a", "b"), inputs="x", phases=("forward", "backward", "step"),
        steps=2, sync_weights=False, strict_weights=True, mapping=None, record=RecordSpec(),
        training=TrainingSpec(OptimizerSpec(), "mean", True, SidesTraining(baseline="forgetful", candidate="forgetful")),
        tolerances=None, expect=None, where="c",
    )  # fmt: skip


def test_a_trainer_returning_no_run_record_fails_the_side(forgetful: CaseSpec) -> None:
    """Added as one module (this one's ``TRAINER``) and one registry line, a trainer runs; the
    run record it forgot is a ``CaseError``, not a run judged without a plan."""
    case = forgetful
    model = LoadedModel("tiny", _Net(), None)
    with pytest.raises(
        CaseError,
        match=r"forgetful trained 2 step\(s\) but its run record lacks its settings and plan and the scalars of step\(s\) \[0, 1\]",
    ):
        run_side(model, CaseInputs({"x": torch.ones(1, 3)}, None), case, {"side": "baseline"}, seed=0)
    assert trainer_info("forgetful").driver == "tests.run.test_case_trainers"


def test_what_a_trainer_cannot_do_is_asked_of_its_registry_entry(forgetful: CaseSpec, tmp_path: Path) -> None:
    """Isolation, a launched side and data-parallel replicas: each refused from the entry's
    flags, naming the trainers that can."""
    model = LoadedModel("tiny", _Net(), None)
    data = CaseInputs({"x": torch.ones(1, 3)}, None)
    with pytest.raises(
        CaseError,
        match=r"isolation is not available with training: forgetful \(a forgetful loop\); set training: "
        + ", ".join(n for n in trainer_names() if trainer_info(n).isolation)
        + "$",
    ):
        run_side(
            model, data, forgetful, {"side": "baseline"}, seed=0, after_first_forward=lambda recorder: None
        )
    spec = ModelSpec("mc", "megatron", {"launch": {"nproc": 2}}, "cpu", "float32", 0, None, "align.yaml:3")
    with pytest.raises(
        CaseError,
        match=r"models.mc: a side launched under torchrun cannot train with training: forgetful \(a forgetful loop\); "
        + "launchable: "
        + ", ".join(n for n in trainer_names() if trainer_info(n).launchable)
        + "$",
    ):
        run_launched(spec, tmp_path, forgetful, data, None, {"side": "candidate"}, 0)
    replicas = replace(spec, options={"launch": {"nproc": 2}, "data_parallel": 2})
    looped = replace(
        forgetful, training=replace(forgetful.training, trainers=SidesTraining(candidate="loop"))
    )
    with pytest.raises(
        CaseError, match=r"models.mc.data_parallel: .* needs phase step and training: megatron$"
    ):
        run_launched(replicas, tmp_path, looped, data, None, {"side": "candidate"}, 0)


# A trainer name compared as a string (``x == "megatron"``, ``"hf_trainer" in (...)``,
# ``trainer == ...``): outside the registry, what a trainer can do is asked of the registry.
# "megatron" is also a model source and a checkpoint format: ``source == "megatron"`` and
# ``fmt == "megatron"`` compare those, not trainers.
OTHER_WORDS = ("source", "fmt")


def _comparisons(root: Path) -> list[str]:
    names = "|".join(map(re.escape, trainer_names()))
    operand = re.compile(  # what is compared: ``x == "name"``, ``x in ("a", "name")``
        rf"""(\S+?)\s*(?:[=!]=|\s(?:not\s+)?in)\s*(?:[(\[{{][^)\]}}]*)?["'](?:{names})["']"""
    )
    quoted = re.compile(rf"""["'](?:{names})["']\s*(?:[=!]=|not\s+in\b|in\b)""")
    named = re.compile(r"\btrainer\w*\s*(?:[=!]=|(?:not\s+)?in\s*[(\[{])")
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == REGISTRY:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            compared = [m.group(1) for m in operand.finditer(line)]
            if (
                any(not word.endswith(OTHER_WORDS) for word in compared)
                or quoted.search(line)
                or named.search(line)
            ):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_trainer_name_is_compared_as_a_string_outside_the_registry() -> None:
    assert _comparisons(SRC) == []


def test_the_comparison_check_finds_one(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('if trainer == "loop":\n    pass\n')
    (tmp_path / "b.py").write_text('if "hf_trainer" in (a, b):\n    pass\n')
    (tmp_path / "c.py").write_text('split = chosen != "megatron"\n')
    (tmp_path / "c2.py").write_text('ok = chosen in ("hf_trainer", "megatron")\n')
    (tmp_path / "c3.py").write_text('ok = job.get("trainer") == "megatron"\n')
    (tmp_path / "d.py").write_text('info = trainer_info("megatron")\n')  # asking the registry is fine
    (tmp_path / "e.py").write_text(
        'if spec.source == "megatron" or source in ("hf", "megatron"):\n    pass\n'
    )
    found = [line.split(":")[0] for line in _comparisons(tmp_path)]
    assert found == ["a.py", "b.py", "c.py", "c2.py", "c3.py"]  # e.py compares model sources


def test_a_trainer_whose_framework_is_not_installed_is_one_case_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``training: lightning`` without Lightning installed: one message naming the trainer
    and the framework, not an ImportError traceback."""
    import sys

    from pytest_precalign.errors import CaseError
    from pytest_precalign.run.trainers import case_trainer

    monkeypatch.setitem(sys.modules, "lightning", None)  # what Python does for a missing package
    monkeypatch.delitem(sys.modules, "lightning.pytorch", raising=False)
    monkeypatch.delitem(sys.modules, "pytest_precalign.run.trainers.lightning", raising=False)
    with pytest.raises(
        CaseError, match=r"training: lightning trains with PyTorch Lightning, which cannot be imported"
    ):
        case_trainer("lightning")
