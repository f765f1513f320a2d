"""``training:`` is validated from the trainer registry alone (``training/trainer_registry.py``):
the names it lists, the sources each entry trains, each side's default, and what each
framework cannot express of the optimizer spec, named at the YAML key that says it. A
trainer added to the registry is accepted by the config with no other change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError
from pytest_precalign.training import trainer_registry
from pytest_precalign.training.spec import OptimizerSpec, SpecProblem
from pytest_precalign.training.trainer_registry import (
    PLAIN,
    TRAINERS,
    TrainerInfo,
    default_trainer,
    trainer_info,
    trainer_names,
)
from tests.config.test_training_config import BASE  # base: an hf model, cand: a factory model


def _error(tmp_path: Path, extra: str) -> str:
    with pytest.raises(ConfigError) as excinfo:
        load_config(BASE + extra, tmp_path / "align.yaml")
    return str(excinfo.value)


def _never(optimizer: OptimizerSpec, steps: int) -> SpecProblem | None:
    """A framework that cannot run a decaying schedule, named at ``schedule.decay``."""
    if optimizer.schedule is None or optimizer.schedule.decay == "constant":
        return None
    return SpecProblem(f"keras cannot decay over {steps} steps", "schedule.decay")


@pytest.fixture
def keras(monkeypatch: pytest.MonkeyPatch) -> TrainerInfo:
    """A fourth trainer, registered by one registry line."""
    info = TrainerInfo("keras", "Keras 3", ("factory",), "tests.nowhere", problem=_never)
    monkeypatch.setattr(trainer_registry, "TRAINERS", (*TRAINERS, info))
    return info


def test_the_registry_names_each_trainer_once_with_its_driver() -> None:
    names = trainer_names()
    assert len(set(names)) == len(names) >= 3
    for name in names:
        info = trainer_info(name)
        assert info.driver.startswith("pytest_precalign.run.trainers.")
        assert info.param_grads in ("step", "backward") and info.sources
    with pytest.raises(KeyError, match="unknown trainer 'keras'"):
        trainer_info("keras")


def test_each_source_defaults_to_the_entry_that_claims_it() -> None:
    for info in TRAINERS:
        for source in info.default_for:
            assert default_trainer(source) == info.name and source in info.sources
    assert default_trainer("factory") is None  # no entry claims it: the tool's loop (PLAIN)
    assert {"hf", "factory", "megatron"} <= set(trainer_info(PLAIN).sources)


def test_an_unknown_trainer_lists_the_registrys_names(tmp_path: Path) -> None:
    message = _error(tmp_path, "    training: keras\n")
    assert f"cases[0].training: unknown trainer 'keras' (allowed: {', '.join(trainer_names())})" in message
    assert str(tmp_path / "align.yaml") in message and "\n" not in message


def test_a_trainer_added_to_the_registry_is_accepted(tmp_path: Path, keras: TrainerInfo) -> None:
    config = load_config(BASE + "    training: {candidate: keras}\n", tmp_path / "align.yaml")
    assert config.cases[0].training.candidate == "keras"
    assert trainer_names()[-1] == "keras"
    assert f"allowed: {', '.join(trainer_names())})" in _error(tmp_path, "    training: tf\n")


def test_a_source_outside_an_entrys_sources_lists_the_trainers_that_can(
    tmp_path: Path, keras: TrainerInfo
) -> None:
    message = _error(tmp_path, "    training: {baseline: keras}\n")
    able = ", ".join(n for n in trainer_names() if "hf" in trainer_info(n).sources)
    assert "cases[0].training.baseline: trainer 'keras' cannot train model 'base' (source 'hf'; " in message
    assert message.endswith(f"allowed: {able})") and "keras" not in able


def test_an_entrys_problem_is_named_at_its_key_with_the_side_and_framework(
    tmp_path: Path, keras: TrainerInfo
) -> None:
    message = _error(
        tmp_path, "    training: {candidate: keras}\n    optimizer: {schedule: {decay: cosine}}\n"
    )
    assert message.endswith(
        "cases[0].optimizer.schedule.decay: the candidate side trains with Keras 3: "
        "keras cannot decay over 3 steps"
    )
    # The same spec on a side whose trainer can express it is no problem.
    config = load_config(
        BASE + "    training: {candidate: loop}\n    optimizer: {schedule: {decay: cosine}}\n",
        tmp_path / "align.yaml",
    )
    assert config.cases[0].training.candidate == "loop"


def test_a_problem_of_the_whole_optimizer_is_named_at_optimizer(tmp_path: Path, keras: TrainerInfo) -> None:
    whole = replace(
        keras, problem=lambda spec, steps: SpecProblem("keras has no SGD") if spec.name == "sgd" else None
    )
    trainer_registry.TRAINERS = (*TRAINERS, whole)  # restored by the fixture's monkeypatch
    message = _error(tmp_path, "    training: {candidate: keras}\n    optimizer: {name: sgd}\n")
    assert message.endswith("cases[0].optimizer: the candidate side trains with Keras 3: keras has no SGD")
