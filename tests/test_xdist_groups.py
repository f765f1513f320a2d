"""Under ``pytest -n 2`` the tests sharing an expensive fixture are one scheduling unit
(tests/helpers/xdist_groups.py): the table of grouped modules against what the fixtures say."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.conftest import COLLECTED
from tests.helpers.xdist_groups import MODULE_GROUPS, REPO, fixture_groups, unit_of


def test_every_module_whose_tests_share_a_fixture_is_one_unit(request: pytest.FixtureRequest) -> None:
    """Every collected test using a module- or session-scoped fixture of tests/ is in a grouped
    module, and the tests sharing one fixture (a session one across modules) are in one unit.
    Checked on the tests collected in this session (before -k/-m): the whole suite under
    ``pytest -n 2``."""
    units: dict[str, set[str]] = defaultdict(set)
    for nodeid, group in fixture_groups(request.config.stash[COLLECTED]).items():
        module = nodeid.split("::", 1)[0]
        assert module in MODULE_GROUPS, f"{module}: its tests share {group}; add it to MODULE_GROUPS"
        units[group].add(unit_of(nodeid))
    split = {group: sorted(found) for group, found in units.items() if len(found) > 1}
    assert not split, f"tests sharing one fixture are in several units: {split}"


def test_the_table_names_existing_modules() -> None:
    missing = [module for module in MODULE_GROUPS if not (REPO / module).is_file()]
    assert not missing, f"MODULE_GROUPS names modules that do not exist: {missing}"


@pytest.mark.parametrize(
    ("nodeid", "unit"),
    [
        (
            "tests/parallel/test_merge.py::test_layouts_compare_aligned[tp1-tp2]",
            "tests/parallel/test_merge.py",
        ),
        ("tests/cli/test_recorded_runs.py::test_a_rerun", "recorded_runs"),
        ("tests/user_runs/test_loop_runs.py::test_a_rerun_of_the_loop_passes", "recorded_runs"),
        ("tests/msprobe/test_fault_corpus.py::test_x[a::b]", "session:corpus"),
        ("tests/verdict/test_trust.py::test_incomparable", "tests/verdict/test_trust.py::test_incomparable"),
    ],
)
def test_a_grouped_modules_tests_are_one_unit_and_any_other_test_its_own(nodeid: str, unit: str) -> None:
    assert unit_of(nodeid) == unit
