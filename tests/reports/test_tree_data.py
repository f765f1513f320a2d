"""The module tree's data (reports/tree.py), from report.json entries: hierarchy, bands per
phase spreading up to the root, both names, API calls under their module, the origin's path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_precalign.cli import main
from pytest_precalign.reports.tree import BANDS, case_tree
from tests.helpers.paths import MSPROBE_DATA


def _rec(
    name: str, value: float | str, allowed: float = 1.0, status: str = "ok", **extra: Any
) -> dict[str, Any]:
    check = {
        "metric": "allclose",
        "value": value,
        "allowed": allowed,
        "passed": status == "ok",
        "upper": True,
    }
    return {
        "name": name,
        "kind": "activation",
        "slot": "out",
        "step": 0,
        "status": status,
        "checks": [check],
        **extra,
    }


def _entry(phase: str, records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "phase": phase,
        "records": records,
        "unmatched": {"baseline": [], "candidate": []},
        "nonfinite": [],
        **extra,
    }


def _nodes(tree: dict[str, Any]) -> dict[str, list[Any]]:
    return {n[1]: n for n in tree["nodes"]}


def test_bands_spread_up_per_phase_and_the_origin_path_is_open() -> None:
    origin = {"module": "m.layers.1.mlp", "record": "m.layers.1.mlp", "phase": "forward"}
    forward = _entry(
        "forward",
        [_rec("m.layers.0.attn", 0.2), _rec("m.layers.0.mlp", 0.7, candidate_name="d.layers.0.mlp"),
         _rec("m.layers.1.mlp", 3.0, status="fail"), _rec("m.norm", "nan", status="fail")],
        origin=origin,
        unmatched={"baseline": [], "candidate": [{"name": "d.extra", "kind": "activation", "slot": "out"}]},
    )  # fmt: skip
    backward = _entry("backward", [_rec("m.layers.1.mlp", 0.1)], origin=origin)
    tree = case_tree([forward, backward])
    nodes = _nodes(tree)
    band = {path: {p: BANDS[b] for p, b in n[5].items()} for path, n in nodes.items()}
    assert band["m.layers.0.attn"] == {"forward": "aligned"}
    assert band["m.layers.0.mlp"] == {"forward": "close"} and nodes["m.layers.0.mlp"][2] == "d.layers.0.mlp"
    assert band["m.layers.0"] == {"forward": "close"}
    assert band["m.layers.1.mlp"] == {"forward": "over", "backward": "aligned"}
    assert band["m.norm"] == {"forward": "nonfinite"} and band["m"]["forward"] == "nonfinite"
    assert band["d.extra"] == {"forward": "unmatched"} and band[""]["forward"] == "nonfinite"
    assert nodes["m.layers"][7]["forward"] == 3.0  # the worst value/allowed below it
    assert tree["origin"] == {"path": "m.layers.1.mlp", "phase": "forward"}
    opened = {tree["nodes"][i][1] for i in tree["open"]}
    assert opened == {"", "m", "m.layers", "m.layers.1", "m.layers.1.mlp"}
    mlp_rows = [tree["rows"][r] for r in nodes["m.layers.1.mlp"][8]]
    assert [(r[0], r[9]) for r in mlp_rows] == [("forward", "over"), ("backward", "aligned")]


def test_api_calls_of_an_msprobe_mix_dump_sit_under_their_module(tmp_path: Path) -> None:
    dump = MSPROBE_DATA / "tiny_statistics_mix"
    assert main(["compare", str(dump), str(dump), "--report", str(tmp_path)]) == 0
    entries = json.loads((tmp_path / "report.json").read_text())["cases"]
    records = [r for e in entries for r in e["records"]]
    apis = [r for r in records if r["name"].startswith(("Functional.", "Tensor.", "Torch."))]
    inside = [r for r in apis if r.get("parent")]  # the loss's calls run outside the model: top level
    assert len(inside) > 0.9 * len(apis) > 0
    tree = case_tree(entries)
    nodes = _nodes(tree)
    for r in inside:
        node = nodes[f"{r['parent']}.{r['name']}"]
        ancestors = []
        while node[3] >= 0:
            node = tree["nodes"][node[3]]
            ancestors.append(node[1])
        assert r["parent"] in ancestors  # under its enclosing module, not at the top level
    top = {r["name"].split(".")[0] for r in apis if not r.get("parent")}
    assert {n[1] for n in tree["nodes"] if n[3] == 0} == {"model", "lm_head", *top}  # no Tensor node
