"""docs/architecture.md's layer table is the import contract: its rows are the layers of
pyproject.toml's "Stages import downwards only" contract, in its order from the bottom, and
name every module of each layer (so a layer added, moved or renamed changes the page)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]


def contract_layers() -> list[set[str]]:
    """The layers of the stage contract, from the bottom, each as the set of its modules."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == "Stages import downwards only"
    )
    return [{name.strip() for name in layer.split("|")} for layer in reversed(contract["layers"])]


def page_layers(page: str) -> list[set[str]]:
    """The first column of the table under ``## Layers``: the modules each row names."""
    section = page.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [
        {name.removesuffix(".py").removesuffix("/") for name in re.findall(r"`([^`]+)`", row.split("|")[1])}
        for row in rows
    ]


def test_the_layer_table_is_the_import_contract_in_order() -> None:
    layers = contract_layers()
    assert {"checkpoints"} in layers and {"untrusted"} in layers
    assert page_layers((REPO / "docs" / "architecture.md").read_text(encoding="utf-8")) == layers


def test_a_layer_out_of_order_is_caught() -> None:
    page = "# A\n\n## Layers\n\n| layer | holds |\n|---|---|\n| `errors.py`, `vocabulary.py` | x |\n| `trace/` | y |\n"
    assert page_layers(page) == [{"errors", "vocabulary"}, {"trace"}]
    assert page_layers(page) != contract_layers()[:2]


def test_the_training_flow_is_described() -> None:
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    flow = page.split("## A training run, through the code", 1)[1].split("\n## ", 1)[0]
    stages = ["**Plan.**", "**Contract before step 0.**", "**Training", "**Per-step scalars.**"]
    stages += ["**Run verdict.**", "**Step replay.**"]
    assert [flow.index(stage) for stage in stages] == sorted(flow.index(stage) for stage in stages)
