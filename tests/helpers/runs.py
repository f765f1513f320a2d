"""Types shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

# tests/integration/conftest.py's ``run_pytest`` fixture: ``run_pytest(*args)``
RunPytest = Callable[..., pytest.RunResult]

# tests/conftest.py's ``example_suite`` fixture: ``example_suite(name)`` copies
# example_suites/<name> into the pytester folder and returns the copy
ExampleSuite = Callable[[str], Path]
