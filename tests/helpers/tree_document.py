"""A 7B-shaped report document (28 layers x 12 modules, forward, backward and step; records
summarised, never tensors) and the module-tree interactions timed on it in Chromium: shared by
tests/reports/test_tree_scale.py (which asserts what they show) and
benchmarks/report_tree_scale.py (which prints the sizes and times)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pytest_precalign.reports.document import write_reports
from tests.helpers.browser import Page

LAYERS = 28
MODULES = ("input_layernorm", "self_attn", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
           "self_attn.o_proj", "post_attention_layernorm", "mlp", "mlp.gate_proj", "mlp.up_proj",
           "mlp.down_proj", "mlp.act_fn")  # fmt: skip
LINEARS = [m for m in MODULES if m.endswith("_proj")]
ORIGIN = "model.layers.17.mlp.down_proj"
SHAPE = [1, 4096, 3584]  # a 7B's hidden states: 58 MB a tensor in fp32, never embedded


def _record(seq: int, name: str, kind: str, late: bool) -> dict[str, Any]:
    value = 3e-2 if late else 1e-6 * (1 + seq % 7)
    allowed = 1.6e-2
    return {
        "seq": seq, "name": name, "kind": kind, "slot": "out" if kind != "param_grad" else "", "step": 0,
        "call": 0, "status": "fail" if value > allowed else "ok", "evidence": "tensor",
        "severity": value / allowed, "atol": 1e-2, "rtol": 1.6e-2, "dtype": "bfloat16", "shape": SHAPE,
        "candidate_dtype": "bfloat16", "candidate_shape": SHAPE,
        "candidate_name": name.replace("model.layers", "decoder.layers"),
        "stats": {"baseline": [4.1, -3.9, 0.01, 812.5], "candidate": [4.1, -3.9, 0.01, 812.5 + value]},
        "rule": "rule match='*': bf16 budget",
        "checks": [{"metric": "allclose", "value": value, "allowed": allowed, "passed": value <= allowed,
                    "upper": True}],
    }  # fmt: skip


def _entry(phase: str) -> dict[str, Any]:
    names = [f"model.layers.{i}.{m}" for i in range(LAYERS) for m in MODULES]
    kinds = {"forward": ["activation"], "backward": ["grad_output", "grad_input"], "step": ["param_grad"]}[
        phase
    ]
    if phase == "step":
        names = [f"model.layers.{i}.{m}.weight" for i in range(LAYERS) for m in LINEARS]
    records = []
    for seq, name in enumerate(names):
        layer = int(name.split(".")[2])
        late = layer > 17 or name.startswith(ORIGIN) or (phase != "forward" and layer >= 17)
        records += [_record(seq, name, kind, late) for kind in kinds]
    failed = sum(r["status"] == "fail" for r in records)
    return {
        "config": "align.yaml", "name": "qwen_7b_shape", "phase": phase, "passed": False, "verdict": "failed",
        "baseline": "hf", "candidate": "megatron", "table": "bf16", "compared": len(records), "failed": failed,
        "origin": {"module": ORIGIN, "phase": "forward", "kind": "activation", "step": 0, "record": ORIGIN,
                   "evidence": "its inputs matched, its output did not", "proven": True},
        "first_divergence": None, "worst": None, "overflow": [], "nonfinite": [],
        "unmatched": {"baseline": [], "candidate": [{"name": "decoder.layers.0.self_attention.core_attention",
                      "kind": "activation", "slot": "out", "reason": "", "unexplained": True}]},
        "failures": [], "records": records, "environment": {},
    }  # fmt: skip


def seven_b_entries() -> list[dict[str, Any]]:
    return [_entry(p) for p in ("forward", "backward", "step")]


def measure_tree(folder: Path, browser: Any) -> dict[str, float]:
    """Write the 7B-shaped report into ``folder`` and drive its tree in ``browser``: sizes (bytes),
    counts and seconds; each interaction's result is checked on the way."""
    entries = seven_b_entries()
    started = time.perf_counter()
    write_reports(folder, entries, {"config": "align.yaml"})
    out: dict[str, float] = {"write_s": time.perf_counter() - started}
    out["html_bytes"] = (folder / "report.html").stat().st_size
    out["json_bytes"] = (folder / "report.json").stat().st_size
    out["records"] = sum(len(e["records"]) for e in entries)
    started = time.perf_counter()
    view = Page(browser, folder / "report.html")
    page = view.page
    try:
        tree = page.locator('section.tree-view[data-case="qwen_7b_shape"]')
        origin = tree.locator('li[data-origin="true"]')
        assert origin.is_visible() and origin.get_attribute("data-path") == ORIGIN
        out["load_s"] = time.perf_counter() - started
        out["nodes"] = tree.locator("li[role=treeitem]").count()

        started = time.perf_counter()
        tree.locator(".tree-search").fill("layers.27.mlp.down")
        assert tree.locator(".tree-count").inner_text() == "2 matching"  # the module and its weight
        assert tree.locator('li[data-path="model.layers.27.mlp.down_proj"]').is_visible()
        assert not tree.locator('li[data-path="model.layers.3.mlp"]').is_visible()
        out["search_s"] = time.perf_counter() - started
        tree.locator(".tree-search").fill("")

        started = time.perf_counter()
        tree.locator('.tree-filter[value="over"]').check()
        over = sum(1 for r in entries[0]["records"] if r["status"] == "fail")
        assert tree.locator(".tree-count").inner_text() == f"{over} matching"
        tree.locator('.phase-switch button[data-phase="step"]').click()
        step_over = sum(1 for r in entries[2]["records"] if r["status"] == "fail")
        assert tree.locator(".tree-count").inner_text() == f"{step_over} matching"
        assert origin.get_attribute("data-band") == "over"  # its weight's gradient, below it
        out["filter_switch_s"] = time.perf_counter() - started
        assert view.errors == [] and all(u.startswith("file://") for u in view.requests)
    finally:
        view.close()
    return out
