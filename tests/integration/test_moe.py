"""``record.moe`` end to end: the plugin runs a MoE case whose dispatchers differ (aligned) and
one with a bug in expert 2 (the failure names that expert as the origin). The models: tests/moe/test_moe_by_token.py's HF Qwen2-MoE with unfused experts."""

from __future__ import annotations

import pytest

from tests.helpers.runs import RunPytest
from tests.moe.test_moe_by_token import CONFIG, NETS


def _config() -> str:
    head, cases = CONFIG.split("cases:\n")
    keep = [c for c in cases.split("\n  - ") if "name: by_token" in c or "name: expert_bug" in c]
    return head + "cases:\n" + "".join(f"  - {c.removeprefix('  - ').rstrip()}\n" for c in keep)


def test_moe_cases_by_token_through_the_plugin(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    (pytester.path / "moe_nets.py").write_text(NETS, encoding="utf-8")
    (pytester.path / "align.yaml").write_text(_config(), encoding="utf-8")
    result = run_pytest("--align-config", "align.yaml", "-rN")
    # by_token: forward and backward pass; expert_bug: forward (origin) and backward fail.
    result.assert_outcomes(passed=2, failed=2)
    text = result.stdout.str()
    assert "Origin: model.layers.0.mlp.experts.2 (forward, step 0)" in text, text
    assert "model.layers.0.mlp.experts.0 " not in text
