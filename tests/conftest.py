from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browser import launch
from tests.helpers.msprobe_faults import make_corpus
from tests.helpers.paths import EXAMPLES
from tests.helpers.xdist_groups import make_scheduler


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest -n N`` (the README's ``-n 2``) without ``--dist``: the tests sharing an expensive
    fixture run on one worker (tests/helpers/xdist_groups.py)."""
    given = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split()]
    if config.getvalue("dist") != "load" or any(arg.startswith("--dist") or arg == "-d" for arg in given):
        return None
    return make_scheduler(config, log)


COLLECTED = pytest.StashKey[list[pytest.Item]]()


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every collected test, selected or not: tests/test_xdist_groups.py checks their fixtures."""
    config.stash[COLLECTED] = list(items)


@pytest.fixture
def tiny_qwen2_config() -> dict[str, int | bool]:
    return {
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    }


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The msprobe fault corpus (tests/helpers/msprobe_faults.py), dumped by the real msprobe
    once per session and shared by the xdist workers: tests/msprobe/ and tests/integration/."""
    shared = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):  # an xdist worker
        shared = shared.parent  # the xdist workers' common folder
    return make_corpus(shared)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (tests/helpers/browser.py), once per module: the report.html tests."""
    yield from launch()


@pytest.fixture
def example_suite(pytester: pytest.Pytester):
    """Copy an example suite into the pytester dir and return its folder."""

    def copy(name: str) -> Path:
        target = pytester.path / name
        shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("__pycache__"))
        return target

    return copy


# Hypothesis (fuzzing and the divergence search tests): bounded and reproducible in CI, no
# example database written into the repo. PRECALIGN_FUZZ_EXAMPLES=2000 fuzzes longer, with
# fresh random examples each run.
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the test extra installs it; without it only the fuzz tests are skipped
    pass
else:
    _fuzz_examples = os.environ.get("PRECALIGN_FUZZ_EXAMPLES")
    settings.register_profile(
        "precalign",
        max_examples=int(_fuzz_examples or 60),
        deadline=None,
        database=None,
        derandomize=_fuzz_examples is None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile("precalign")
