"""A user's TRL ``SFTTrainer`` + PEFT LoRA fine-tune recorded with ``PrecalignCallback``
(``example_suites/recorded_runs/sft_lora.py`` in a subprocess) and judged by ``precalign
compare``: another ``lora_alpha`` or bf16 autocast on one side is a ``settings``
difference named before step 0; a rerun and the same rows in another micro-batch split pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.user_runs import (
    compare,
    env_diff,
    record,
)

pytest.importorskip("trl")
pytest.importorskip("peft")

SCRIPT = "sft_lora.py"


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(
        SCRIPT,
        tmp_path_factory.mktemp("sft"),
        "base",
        "rerun",
        "alpha8:lora_alpha=8",
        "bf16:bf16=on",
        "micro41:micro=4x1",
    )


@pytest.mark.slow
@pytest.mark.parametrize("clean", ["rerun", "micro41"])
def test_a_clean_lora_pair_passes(sft_runs: Path, tmp_path: Path, clean: str) -> None:
    judged = compare(sft_runs / "base", sft_runs / clean, tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cand", "named"),
    [("alpha8", ("lora_alpha", "16", "8")), ("bf16", ("autocast",))],
    ids=["lora_alpha", "bf16"],
)
def test_a_settings_difference_is_named_before_step_0(
    sft_runs: Path, tmp_path: Path, cand: str, named: tuple[str, ...]
) -> None:
    judged = compare(sft_runs / "base", sft_runs / cand, tmp_path / "report")
    assert judged.exit_code == 1
    assert judged.training["first_divergent"] == "settings"
    story = next(
        line for line in judged.output.splitlines() if line.strip().startswith("Step 0 diverged first")
    )
    assert all(word in story for word in named), story


@pytest.mark.slow
def test_env_diff_names_trl_and_peft_of_a_recorded_run(sft_runs: Path) -> None:
    code, out = env_diff(sft_runs / "base" / "step0" / "rank0", sft_runs / "rerun" / "step0" / "rank0")
    assert code == 0, out
    assert "trl " in out and "peft " in out
