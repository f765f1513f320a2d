"""``training:`` is validated from the trainer registry alone (``steps/trainer_registry.py``):
the names it lists, the sources each entry trains, each side's default, and what each
framework cannot express of the optimizer spec, named at the YAML key that says it. A
trainer added to the registry is accepted by the config with no other change."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import ConfigError
from pytest_precalign.steps.spec import OptimizerSpec, SpecProblem
from pytest_precalign.steps.trainer_registry import (
    PLAIN,
    TRAINERS,
    TrainerInfo,
    default_trainer,
    register_trainer,
    trainer_info,
    trainer_names,
    unregister_trainer,
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
def keras() -> Iterator[TrainerInfo]:
    """A fifth trainer, registered by ``register_trainer`` (removed after the test)."""
    info = TrainerInfo("keras", "Keras 3", ("factory",), "tests.nowhere", problem=_never)
    register_trainer(info)
    yield info
    unregister_trainer(info.name)


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
    for info in TRAINERS.values():
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
    assert config.cases[0].training.trainers.candidate == "keras"
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
    assert config.cases[0].training.trainers.candidate == "loop"


def test_a_problem_of_the_whole_optimizer_is_named_at_optimizer(tmp_path: Path, keras: TrainerInfo) -> None:
    whole = replace(
        keras, problem=lambda spec, steps: SpecProblem("keras has no SGD") if spec.name == "sgd" else None
    )
    TRAINERS["keras"] = whole  # removed by the fixture
    message = _error(tmp_path, "    training: {candidate: keras}\n    optimizer: {name: sgd}\n")
    assert message.endswith("cases[0].optimizer: the candidate side trains with Keras 3: keras has no SGD")


def test_a_name_registered_twice_is_refused(keras: TrainerInfo) -> None:
    """Neither a built-in trainer's name nor one registered already can be taken again; the
    registry is left as it was."""
    for name, holder in ((PLAIN, "the tool's torch.optim loop"), ("keras", "Keras 3")):
        with pytest.raises(
            ConfigError, match=re.escape(f"a trainer named '{name}' is already registered ({holder}")
        ):
            register_trainer(replace(keras, name=name, framework="an impostor"))
    assert trainer_info(PLAIN).framework == "the tool's torch.optim loop" and trainer_info("keras") == keras
    with pytest.raises(ConfigError, match="needs a name that is an identifier"):
        register_trainer(replace(keras, name="my trainer"))
    unregister_trainer(PLAIN)  # a built-in trainer stays
    assert PLAIN in trainer_names()


ENTRY_POINT_DIST = {
    "acme_trainers.py": (
        "from pytest_precalign.steps.trainer_registry import TrainerInfo\n"
        "ACME = TrainerInfo('acme', \"ACME's loop\", ('factory',), 'acme_loop')\n"
    ),
    "acme-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: acme\nVersion: 1.0\n",
    "acme-1.0.dist-info/entry_points.txt": "[pytest_precalign.trainers]\nacme = acme_trainers:ACME\n",
}


def test_an_installed_distributions_entry_point_registers_its_trainer(tmp_path: Path) -> None:
    """A distribution on the path whose entry point (group ``pytest_precalign.trainers``) is a
    ``TrainerInfo``: a fresh interpreter (as a launched rank is) sees the trainer, and the
    config accepts ``training: acme``, with nothing registered by hand."""
    for name, text in ENTRY_POINT_DIST.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    script = (
        "import sys; from pathlib import Path\n"
        "from pytest_precalign.config.loader import load_config\n"
        "from pytest_precalign.steps.trainer_registry import trainer_info\n"
        "from tests.config.test_training_config import BASE\n"
        "config = load_config(BASE + '    training: {candidate: acme}\\n', Path(sys.argv[1]) / 'align.yaml')\n"
        "print(config.cases[0].training.trainers.candidate, trainer_info('acme').framework)\n"
    )
    root = Path(__file__).parents[2]
    path = f"{tmp_path}:{root / 'src'}:{root}"
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
        env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "acme ACME's loop"
