"""Which xdist worker runs a test of this suite: the tests sharing an expensive fixture on one.

xdist's default ``--dist load`` hands each worker chunks of consecutive tests, so a module's tests
can be split between the two workers of ``pytest -n 2``: a module- or session-scoped fixture (a
torchrun launch, a recorded training run) is then built on both, and a run made once per session
(``session_once``) keeps the second worker waiting on the first one's lock. xdist's own
``loadgroup`` cannot help: it renames the items (``nodeid@group``), which pytest 9.2's node ids
no longer allow. So under ``-n N`` without ``--dist`` (``tests/conftest.py``) the scheduler is
``GroupScheduling``: xdist's scope scheduling whose unit is a module of ``MODULE_GROUPS`` (the
modules sharing runs are one unit), every other test a unit of its own as ``load`` schedules it.
``tests/test_xdist_groups.py`` checks that the table holds every module whose tests use such a
fixture (``fixture_groups``: what the fixtures say)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

# Modules whose fixtures make or reuse the same runs: one unit, so that one worker makes them and
# the other never waits on its lock nor makes them again.
SHARED = {
    # record_shared: torch_loop/ and trainer_finetune/ of example_suites/recorded_runs
    "tests/cli/test_recorded_runs.py": "recorded_runs",
    "tests/user_runs/test_loop_runs.py": "recorded_runs",
    "tests/user_runs/test_trainer_runs.py": "recorded_runs",
    # _shared_run: hf_example/ (the ``hf_run`` fixture test_recorder_facts imports)
    "tests/training/test_recorder.py": "megatron_example",
    "tests/training/test_recorder_facts.py": "megatron_example",
    # session-scoped fixtures: ``corpus`` (tests/conftest.py), ``hf_dir`` (tests/checkpoints/)
    "tests/integration/test_msprobe.py": "session:corpus",
    "tests/msprobe/test_fault_corpus.py": "session:corpus",
    "tests/checkpoints/test_check_weights.py": "session:hf_dir",
    "tests/checkpoints/test_checkpoint_cases.py": "session:hf_dir",
    "tests/checkpoints/test_checkpoint_trust.py": "session:hf_dir",
    "tests/checkpoints/test_launched_checkpoint.py": "session:hf_dir",
    "tests/checkpoints/test_megatron_checkpoints.py": "session:hf_dir",
}
# Modules with a module-scoped fixture of their own: each is its own unit.
OWN = [
    "tests/baseline/test_variants.py",
    "tests/calibration/test_calibrate.py",
    "tests/cli/test_env_diff.py",
    "tests/integration/test_report_html.py",
    "tests/integration/test_transformers_upgrade.py",
    "tests/mapping/test_layer_mapping.py",
    "tests/parallel/test_merge.py",
    "tests/parallel/test_msprobe_ranks.py",
    "tests/recording/test_live_golden.py",
    "tests/recording/test_tensor_subclasses.py",
    "tests/reliability/test_checksums.py",
    "tests/reliability/test_crafted_recordings.py",
    "tests/reliability/test_deep_paths.py",
    "tests/reliability/test_fuzz.py",
    "tests/reliability/test_interrupted_run.py",
    "tests/reliability/test_recorded_compare_edges.py",
    "tests/reliability/test_recordings_from_elsewhere.py",
    "tests/reliability/test_training_evidence.py",
    "tests/reports/test_html.py",
    "tests/reports/test_training_html.py",
    "tests/reports/test_tree_html.py",
    "tests/reports/test_tree_scale.py",
    "tests/run/test_launch.py",
    "tests/run/test_tensor_parallel.py",
    "tests/sources/test_npu_device.py",
    "tests/training/test_accelerate_steps.py",
    "tests/training/test_lightning_callback.py",
    "tests/training/test_plans_agree.py",
    "tests/training/test_recorded_settings.py",
    "tests/training/test_tp_plan.py",
    "tests/user_runs/test_sft_lora_runs.py",
]
MODULE_GROUPS = {**{module: module for module in OWN}, **SHARED}


def unit_of(nodeid: str) -> str:
    """A test's scheduling unit: its module's group in ``MODULE_GROUPS``, else the test itself."""
    return MODULE_GROUPS.get(nodeid.split("::", 1)[0], nodeid)


def make_scheduler(config: Any, log: Any) -> Any:
    """``GroupScheduling`` (xdist is imported only when it schedules)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        """xdist's scope scheduling (units with the most tests first) with ``unit_of`` as the scope."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return GroupScheduling(config, log)


def _defined_in_tests(fixturedef: Any) -> bool:
    try:
        return Path(inspect.getfile(fixturedef.func)).resolve().is_relative_to(TESTS)
    except TypeError:  # a built-in without a source file
        return False


def _shared_fixtures(item: Any) -> list[str]:
    """The module- and session-scoped fixtures of tests/ a collected test uses, as keys:
    ``session:<name>`` (made once per worker: shared across modules), the test's module for a
    module-scoped one."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # not a python function (a doctest, a yaml item)
        return []
    module = Path(str(item.path)).resolve().relative_to(REPO).as_posix()
    keys = []
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if not defs or not _defined_in_tests(defs[-1]):
            continue
        if defs[-1].scope == "session":
            keys.append(f"session:{name}")
        elif defs[-1].scope == "module":
            keys.append(module)
    return keys


def fixture_groups(items: list[Any]) -> dict[str, str]:
    """nodeid -> group, for the collected tests using a module- or session-scoped fixture of
    tests/: the tests sharing one (directly or through a test using both) are one group, named
    by its first key in sorted order; the tests using none are left out."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    used = {item.nodeid: _shared_fixtures(item) for item in items}
    for keys in used.values():
        for key in keys[1:]:
            first, other = root(keys[0]), root(key)
            parent[max(first, other)] = min(first, other)
    return {nodeid: root(keys[0]) for nodeid, keys in used.items() if keys}
