"""Every example suite's align.yaml passes ``precalign validate`` (config, sources, mappings),
also the ones whose runs live in tox environments (the torch upgrade) rather than in the suite.
A suite whose conftest registers its own trainers (``pytest_precalign_trainers``) is validated
with them registered, as pytest registers them (the CLI sees a distribution's entry points,
not a conftest)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from pytest_precalign.steps.trainer_registry import register_trainer, unregister_trainer
from tests.helpers.paths import REPO

CONFIGS = sorted((REPO / "example_suites").glob("*/align.yaml"))


def test_there_are_example_configs() -> None:
    assert {p.parent.name for p in CONFIGS} >= {
        "torch_upgrade",
        "transformers_upgrade",
        "qwen2_5_megatron_vs_hf",
        "megatron_families",
        "training",
    }


@pytest.mark.parametrize("config", CONFIGS, ids=[p.parent.name for p in CONFIGS])
def test_example_config_is_valid(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with _conftest_trainers(config.parent):
        assert main(["validate", str(config)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"{config}: valid (")


@contextmanager
def _conftest_trainers(suite: Path) -> Iterator[None]:
    """The trainers ``suite``'s conftest registers, registered while the block runs."""
    conftest = suite / "conftest.py"
    hook = None
    if conftest.is_file():
        spec = importlib.util.spec_from_file_location(f"{suite.name}_conftest", conftest)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        hook = getattr(module, "pytest_precalign_trainers", None)
    infos = list(hook()) if hook is not None else []
    for info in infos:
        register_trainer(info)
    try:
        yield
    finally:
        for info in infos:
            unregister_trainer(info.name)
