"""``benchmarks/recorded_runs.py`` (``python benchmarks/mutations.py --training --recorded``):
its catalogue holds at least 30 recorded-run mutations and the three kinds of fault-free
pair, each expected at a step and class the variant can show; a wrong ``--only`` is one
usage line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import recorded_runs  # noqa: E402


def test_the_catalogue_has_30_recorded_run_mutations_and_the_clean_pairs() -> None:
    pairs = [
        (v, m)
        for v, variant in recorded_runs.VARIANTS.items()
        for m in recorded_runs.CATALOGUE[variant.script]
    ]
    faults = [(v, m) for v, m in pairs if m.step is not None]
    assert len(faults) >= 30
    clean = {m.name for _, m in pairs if m.step is None}
    assert {"clean_rerun", "clean_eager_vs_sdpa", "clean_micro_batches_4x1"} <= clean
    layers = recorded_runs.VARIANTS["callback_steps"]
    bug = next(m for m in recorded_runs.TRAINER if m.name == "mlp_bug_from_step_5")
    assert bug.expected(layers) == (5, "forward", "model.layers.1.mlp")
    assert bug.expected(recorded_runs.VARIANTS["callback_scalars"]) == (5, "loss", "")


def test_an_unknown_mutation_is_one_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        recorded_runs.main(["--only", "no_such_fault"])
    assert exit_.value.code == 2
    assert "--only: unknown mutation(s) no_such_fault (allowed: " in capsys.readouterr().err
