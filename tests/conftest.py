from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "example_suites"


@pytest.fixture
def tiny_qwen2_config() -> dict[str, int | bool]:
    return {
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    }


@pytest.fixture
def example_suite(pytester: pytest.Pytester):
    """Copy an example suite into the pytester dir and return its folder."""

    def copy(name: str) -> Path:
        target = pytester.path / name
        shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("__pycache__"))
        return target

    return copy
