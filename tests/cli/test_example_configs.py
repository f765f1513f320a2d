"""Every example suite's align.yaml passes ``precalign validate`` (config, sources, mappings),
also the ones whose runs live in tox environments (the torch upgrade) rather than in the suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.cli import main
from tests.helpers.paths import REPO

CONFIGS = sorted((REPO / "example_suites").glob("*/align.yaml"))


def test_there_are_example_configs() -> None:
    assert {p.parent.name for p in CONFIGS} >= {
        "torch_upgrade",
        "transformers_upgrade",
        "qwen2_5_megatron_vs_hf",
        "megatron_families",
        "training",
    }


@pytest.mark.parametrize("config", CONFIGS, ids=[p.parent.name for p in CONFIGS])
def test_example_config_is_valid(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(config)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"{config}: valid (")
