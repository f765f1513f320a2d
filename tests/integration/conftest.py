"""End-to-end tests: pytest runs a suite through ``pytester``, in a subprocess.

Every test here takes ``run_pytest`` (or ``plugin_args``), so it runs twice: the inner pytest
serially (id ``serial``) and with ``-n 2`` (id ``xdist``), as syrupy runs its tests with and
without its plugin arguments. A test that asserts something only one mode can show says why
where it does (``if xdist: ...`` or a ``pytest.skip`` with the reason)."""

from __future__ import annotations

# numpy cannot be imported twice in one process, and pytester restores sys.modules after each
# test: imported here, before any test, it stays loaded for tests that read traces themselves.
import numpy  # noqa: F401
import pytest

from tests.helpers.runs import RunPytest


@pytest.fixture(params=[pytest.param([], id="serial"), pytest.param(["-n", "2"], id="xdist")])
def plugin_args(request: pytest.FixtureRequest) -> list[str]:
    """The arguments that set how the inner pytest runs: nothing (serially) or ``-n 2``."""
    return list(request.param)


@pytest.fixture
def xdist(plugin_args: list[str]) -> bool:
    """The inner pytest runs on xdist workers."""
    return bool(plugin_args)


@pytest.fixture
def run_pytest(pytester: pytest.Pytester, plugin_args: list[str]) -> RunPytest:
    """``run_pytest(*args)``: pytest in a subprocess in the pytester folder, with ``args`` then
    the plugin arguments (serial or ``-n 2``) appended; no cache written."""

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", *plugin_args)

    return run
