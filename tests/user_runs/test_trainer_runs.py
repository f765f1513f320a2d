"""A user's ``transformers.Trainer`` fine-tune (tiny Qwen2, variable-length rows with dynamic
padding, warmup + cosine, clipping, weight decay, 2 micro-batches, 10 optimizer steps) recorded
with ``PrecalignCallback`` by the user's own script in a subprocess
(``example_suites/recorded_runs/trainer_finetune.py``), then judged as CI would: ``precalign
compare`` and a ``dump:`` case of an inner pytest. Each fault after step 0 is named at its step
(0-based optimizer steps) and class; a rerun, eager vs sdpa attention (fp32) and the same rows in
another micro-batch split pass.

Issue #32: most of this failed on the code before it (a scalars-only recording was refused,
recordings were judged on step 0's scalars, the callback wrote no plan, the batch hash hashed
padded rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.user_runs import (
    compare,
    dump_suite,
    env_diff,
    record,
    record_shared,
    run_dump_suite,
)

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = "trainer_finetune.py"


@pytest.fixture(scope="module")
def scalars_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default recording (``mode="scalars"``): the baseline and the runs of the fast tests
    (shared with tests/cli/test_recorded_runs.py)."""
    return record_shared(
        tmp_path_factory,
        SCRIPT,
        "trainer_finetune",
        "base",
        "rerun",
        "clip3:clip_from=3",
        "shuffle3:shuffle_from=3",
    )


@pytest.fixture(scope="module")
def more_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The slower matrix: more faults and clean pairs in scalars mode, layers on a chosen step (``steps=[5]``),
    layers every step, and the msprobe format."""
    return record(
        SCRIPT,
        tmp_path_factory.mktemp("trainer_more"),
        "base",
        "sched:scheduler=linear",
        "micro41:micro=4x1",
        "lr:lr=6e-3",
        "bug5:layer_bug_from=5",
        "sdpa:attn=sdpa",
        "s5_base:mode=stats,steps=5",
        "s5_bug5:mode=stats,steps=5,layer_bug_from=5",
        "s5_micro41:mode=stats,steps=5,micro=4x1",
        "s_base:mode=stats",
        "s_bug5:mode=stats,layer_bug_from=5",
        "s_clip3:mode=stats,clip_from=3",
        "ms_base:mode=stats,steps=5,format=msprobe",
        "ms_bug5:mode=stats,steps=5,format=msprobe,layer_bug_from=5",
    )


# -- precalign compare, scalars mode (the callback's default) ------------------------------------
def test_a_rerun_passes(scalars_runs: Path, tmp_path: Path) -> None:
    judged = compare(scalars_runs / "base", scalars_runs / "rerun", tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None)
    assert judged.training["steps_compared"] == 10


@pytest.mark.slow
def test_another_scheduler_is_a_settings_difference_from_step_3(more_runs: Path, tmp_path: Path) -> None:
    judged = compare(more_runs / "base", more_runs / "sched", tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (3, "settings")
    assert "lr_scheduler_type cosine vs linear" in judged.output


@pytest.mark.parametrize(("fault", "step", "diverged"), [("clip3", 3, "clipping"), ("shuffle3", 3, "data")])
def test_a_fault_from_step_k_is_named_at_k(
    scalars_runs: Path, tmp_path: Path, fault: str, step: int, diverged: str
) -> None:
    judged = compare(scalars_runs / "base", scalars_runs / fault, tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (step, diverged)
    assert f"Step {step} diverged first: {diverged}" in judged.output
    assert judged.training["curves"]["steps"] == list(range(10))


@pytest.mark.slow
def test_the_same_rows_in_another_micro_batch_split_pass(more_runs: Path, tmp_path: Path) -> None:
    judged = compare(more_runs / "base", more_runs / "micro41", tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None)


@pytest.mark.slow
def test_another_split_with_layers_recorded_passes_and_says_what_was_not_compared(
    more_runs: Path, tmp_path: Path
) -> None:
    """Layers on step 5 under 2 x 2 and 4 x 1 micro-batches: the module calls cannot be paired
    call by call, so they are not compared (and the report says so); the step's scalars and
    parameters are, and the pair passes."""
    judged = compare(more_runs / "s5_base", more_runs / "s5_micro41", tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None)
    assert any("split them into other micro-batches" in line for line in judged.training["not_compared"])


@pytest.mark.slow
def test_the_micro_batch_split_changes_no_recorded_batch_hash(more_runs: Path) -> None:
    """The same rows as 2 micro-batches of 2 and 1 of 4 (dynamic padding): the callback's
    ``batch_hash`` of every step is the same (the tokens the loss sees, not the padding)."""

    def hashes(run: str) -> list[str]:
        out = []
        for step in range(10):
            manifest = json.loads((more_runs / run / f"step{step}" / "rank0" / "manifest.json").read_text())
            out.append(manifest["scalars"][str(step)]["batch_hash"])
        return out

    assert hashes("base") == hashes("micro41")


def test_env_diff_reads_a_scalars_recording(scalars_runs: Path) -> None:
    code, out = env_diff(
        scalars_runs / "base" / "step0" / "rank0", scalars_runs / "rerun" / "step0" / "rank0"
    )
    assert code == 0, out
    assert "environment: the same" in out


# -- a dump: case in pytest (what CI runs) -----------------------------------------------------
@pytest.mark.slow
def test_dump_cases_gate_the_recorded_runs(scalars_runs: Path, tmp_path: Path) -> None:
    config = dump_suite(
        tmp_path / "suite",
        {
            "rerun": (scalars_runs / "base", scalars_runs / "rerun", None),
            "clipping_expected": (
                scalars_runs / "base",
                scalars_runs / "clip3",
                {"step": 3, "diverged": "clipping"},
            ),
            "data_order": (scalars_runs / "base", scalars_runs / "shuffle3", None),
        },
    )
    done = run_dump_suite(config, tmp_path / "report")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Step 3 diverged first: data" in out
    assert "1 failed, 2 passed" in out.replace(" in ", "\n"), out


# -- the slower matrix ---------------------------------------------------------------------------
@pytest.mark.slow
def test_eager_vs_sdpa_attention_passes(more_runs: Path, tmp_path: Path) -> None:
    judged = compare(more_runs / "base", more_runs / "sdpa", tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None)


@pytest.mark.slow
def test_another_peak_lr_is_a_settings_difference(more_runs: Path, tmp_path: Path) -> None:
    judged = compare(more_runs / "base", more_runs / "lr", tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (1, "settings")
    assert "learning_rate" in judged.output


@pytest.mark.slow
def test_a_layer_bug_in_a_scalars_run_is_the_loss_at_its_step(more_runs: Path, tmp_path: Path) -> None:
    judged = compare(more_runs / "base", more_runs / "bug5", tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (5, "loss")
    assert "record layers" in judged.output


@pytest.mark.slow
@pytest.mark.parametrize(
    "side",
    [
        pytest.param("s5", id="native"),
        pytest.param("ms", id="msprobe"),
    ],
)
def test_layers_on_the_chosen_step_name_the_module(more_runs: Path, tmp_path: Path, side: str) -> None:
    """``PrecalignCallback(root, mode="stats", steps=[5])``: step 5 drills down to the module;
    the other steps are judged on their scalars."""
    judged = compare(more_runs / f"{side}_base", more_runs / f"{side}_bug5", tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (5, "forward")
    assert judged.training["origin"] == "model.layers.1.mlp"
    assert judged.training["steps_compared"] == 10


@pytest.mark.slow
def test_layers_on_every_step_name_the_module(more_runs: Path, tmp_path: Path) -> None:
    judged = compare(more_runs / "s_base", more_runs / "s_bug5", tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (5, "forward")
    assert judged.training["origin"] == "model.layers.1.mlp"


@pytest.mark.slow
def test_clipping_from_step_3_with_layers_on_every_step_is_clipping(more_runs: Path, tmp_path: Path) -> None:
    judged = compare(more_runs / "s_base", more_runs / "s_clip3", tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.verdict() == (3, "clipping")
    assert judged.training["curves"]["steps"] == list(range(10))


@pytest.mark.slow
def test_a_dump_case_expects_the_layer_bug_of_a_run_with_layers_on_every_step(
    more_runs: Path, tmp_path: Path
) -> None:
    """A known divergence declared in the case: it passes only while exactly that is found."""
    expect = {"step": 5, "diverged": "forward", "origin": "model.layers.1.mlp"}
    config = dump_suite(
        tmp_path / "suite",
        {
            "known_bug": (more_runs / "s_base", more_runs / "s_bug5", expect),
            "wrong_step": (more_runs / "s_base", more_runs / "s_bug5", {**expect, "step": 4}),
        },
    )
    done = run_dump_suite(config, tmp_path / "report")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "PASSED known_bug[forward]" in out
    assert "FAILED wrong_step[forward]" in out
