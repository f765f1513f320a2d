"""A user's own training loop recorded with ``Recorder`` + ``record_scalars`` + ``StepEvidence``
as docs/training.md shows (``example_suites/recorded_runs/torch_loop.py``, run in a subprocess),
saved in both formats, judged by ``precalign compare``: the same run verdict whatever the format;
a fault from step k at step k; a rerun passes. The loop writes no plan, so another peak LR is
found in the run (``schedule`` at step 1: step 0 has LR 0 under the warmup); a change too small
for any tolerance at its step is told there when a later step exceeds one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.user_runs import (
    compare,
    record,
    record_shared,
)

pytest.importorskip("transformers")

SCRIPT = "torch_loop.py"


@pytest.fixture(scope="module")
def loop_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs in scalars mode, shared with tests/cli/test_recorded_runs.py."""
    return record_shared(
        tmp_path_factory,
        SCRIPT,
        "torch_loop",
        "base",
        "rerun",
        "lr:lr=6e-3",
        "clip3:clip_from=3",
        "shuffle3:shuffle_from=3",
        "beta2:beta2=0.99",
        "mlp5:layer_bug_from=5,layer_scale=1.01",
    )


@pytest.fixture(scope="module")
def layer_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Layers recorded on step 5, in both formats."""
    return record(
        SCRIPT,
        tmp_path_factory.mktemp("loop_layers"),
        "s5_base:mode=stats,steps=5",
        "s5_bug5:mode=stats,steps=5,layer_bug_from=5",
        "ms_base:mode=stats,steps=5,format=msprobe",
        "ms_rerun:mode=stats,steps=5,format=msprobe",
        "ms_bug5:mode=stats,steps=5,format=msprobe,layer_bug_from=5",
    )


def test_a_rerun_of_the_loop_passes(loop_runs: Path, tmp_path: Path) -> None:
    judged = compare(loop_runs / "base", loop_runs / "rerun", tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None)
    assert judged.training["steps_compared"] == 10


@pytest.mark.parametrize(
    ("fault", "step", "diverged"),
    [
        ("lr", 1, "schedule"),
        ("clip3", 3, "clipping"),
        ("shuffle3", 3, "data"),
        # AdamW's beta2 0.99 (no plan recorded): step 1's update moves first, step 2's grad norm
        # exceeds its tolerance after it.
        ("beta2", 1, "optimizer_update"),
        # layer 1's MLP x 1.01 from step 5: the loss moves at step 5 (inside its tolerance), the
        # grad norm exceeds its own at step 6.
        ("mlp5", 5, "forward"),
    ],
)
def test_a_fault_in_the_loop_is_named_at_its_step(
    loop_runs: Path, tmp_path: Path, fault: str, step: int, diverged: str
) -> None:
    judged = compare(loop_runs / "base", loop_runs / fault, tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (step, diverged)
    assert f"Step {step} diverged first: {diverged}" in judged.output


@pytest.mark.slow
@pytest.mark.parametrize(
    "fmt",
    [
        pytest.param("s5", id="native"),
        pytest.param("ms", id="msprobe"),
    ],
)
def test_layers_on_step_5_name_the_module_in_either_format(
    layer_runs: Path, tmp_path: Path, fmt: str
) -> None:
    judged = compare(layer_runs / f"{fmt}_base", layer_runs / f"{fmt}_bug5", tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (5, "forward")
    assert judged.training["origin"] == "model.layers.1.mlp"
    assert "Step 5 diverged first: forward, origin model.layers.1.mlp" in judged.output


@pytest.mark.slow
def test_an_msprobe_rerun_passes_with_one_run_verdict(layer_runs: Path, tmp_path: Path) -> None:
    judged = compare(layer_runs / "ms_base", layer_runs / "ms_rerun", tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None)
    assert judged.training["steps_compared"] == 10
