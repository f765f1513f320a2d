"""End-to-end tests: pytest runs a suite through ``pytester``.

Every test here takes ``run_pytest`` (or ``plugin_args``): the inner pytest runs serially (id
``serial``). A test whose behaviour depends on xdist -- reports merged from the workers, items
scheduled on workers, errors raised on a worker -- is marked ``@pytest.mark.xdist_twin("why")``
and also runs with ``-n 2`` (id ``xdist``), as syrupy runs its tests with and without its
plugin arguments. A test that asserts something only one mode can show says why where it does
(``if xdist: ...`` or a ``pytest.skip`` with the reason)."""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import _pytest.pytester
import pytest

from tests.helpers.runs import RunPytest

_SITE_PACKAGES = tuple(str(Path(sysconfig.get_paths()[key]).resolve()) for key in ("purelib", "platlib"))


def _installed_library(name: str) -> bool:
    """A module of an installed package (torch, transformers, numpy, megatron...), not the
    project's own code (an editable install under src/) nor a test suite's file."""
    module = sys.modules.get(name)
    where = getattr(module, "__file__", None)
    return isinstance(where, str) and str(Path(where).resolve()).startswith(_SITE_PACKAGES)


class _KeepInstalledLibraries(_pytest.pytester.SysModulesSnapshot):
    """pytester's sys.modules snapshot, keeping installed libraries imported during an
    in-process run: torch, numpy and their extensions cannot be imported twice in one process
    (torch registers its operators once), so a serial inner run can run in process -- several
    seconds faster than a subprocess that imports torch and transformers anew. The project's
    own modules and the test's files are dropped after each run, as pytester does."""

    def __init__(self, preserve: Callable[[str], bool] | None = None) -> None:
        def keep(name: str) -> bool:
            return _installed_library(name) or (preserve is not None and preserve(name))

        super().__init__(preserve=keep)


_pytest.pytester.SysModulesSnapshot = _KeepInstalledLibraries  # type: ignore[misc]


def _forget_shadowed(folder: Path) -> None:
    """A module of the test's folder (its ``nets.py``) imported earlier in this worker from
    another folder -- an in-process ``precalign`` call of another test imports a suite's
    ``nets.py`` and keeps it, as a user's process would -- is dropped from ``sys.modules``, so
    that the in-process run imports the test's own file whichever tests ran before it."""
    here = folder.resolve()
    for name in [
        p.stem for p in here.glob("*.py") if p.stem in sys.modules and not _installed_library(p.stem)
    ]:
        where = getattr(sys.modules[name], "__file__", None)
        if isinstance(where, str) and not Path(where).resolve().is_relative_to(here):
            del sys.modules[name]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``plugin_args``: serially; and ``-n 2`` too for tests marked ``xdist_twin``."""
    if "plugin_args" not in metafunc.fixturenames:
        return
    modes = [pytest.param([], id="serial")]
    if metafunc.definition.get_closest_marker("xdist_twin") is not None:
        modes.append(pytest.param(["-n", "2"], id="xdist"))
    metafunc.parametrize("plugin_args", modes)


@pytest.fixture
def plugin_args(request: pytest.FixtureRequest) -> list[str]:
    """The arguments that set how the inner pytest runs: nothing (serially) or ``-n 2``
    (outside tests/integration, where nothing parametrizes it: serially)."""
    return list(getattr(request, "param", []))


@pytest.fixture
def xdist(plugin_args: list[str]) -> bool:
    """The inner pytest runs on xdist workers."""
    return bool(plugin_args)


@pytest.fixture
def run_pytest(pytester: pytest.Pytester, plugin_args: list[str]) -> RunPytest:
    """``run_pytest(*args)``: pytest in the pytester folder, with ``args`` then the plugin
    arguments appended; no cache written. Serially in process (see ``_KeepInstalledLibraries``),
    with ``-n 2`` in a subprocess (its workers are subprocesses anyway)."""

    def run(*args: str) -> pytest.RunResult:
        if not plugin_args:
            _forget_shadowed(pytester.path)
            basetemp = f"--basetemp={pytester.path / 'bt'}"
            return pytester.runpytest_inprocess(*args, "-p", "no:cacheprovider", basetemp)
        return pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", *plugin_args)

    return run
