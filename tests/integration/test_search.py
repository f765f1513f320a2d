"""Divergence search end to end: hypothesis finds a length-dependent
bug, shrinks it to the minimal example and prints it as a paste-able ``inputs:`` block."""

from __future__ import annotations

import re

import pytest

from tests.helpers.runs import RunPytest
from tests.helpers.search_suite import CONFIG, MASK_BUG


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny models run many small ops: one thread each is faster on a shared 2-core machine
    (pytester's subprocesses inherit it)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _write(pytester: pytest.Pytester, text: str) -> None:
    pytester.makepyfile(mask_bug=MASK_BUG)
    (pytester.path / "align.yaml").write_text(text, encoding="utf-8")


def _run(pytester: pytest.Pytester, run_pytest: RunPytest, text: str, *args: str) -> pytest.RunResult:
    _write(pytester, text)
    return run_pytest("--align-config", "align.yaml", *args)


def _pasted(config: str, block: str, name: str) -> str:
    """The config with the printed block's input added and the case pointed at it."""
    entry = block.split("\n", 1)[1]  # drop the "inputs:" line: the config has one
    text = config.replace("inputs:\n", "inputs:\n" + entry + "\n", 1)
    text = text.replace("    inputs: toks\n", f"    inputs: {name}\n")
    return re.sub(r"    search: .*\n", "", text)


def test_search_shrinks_a_length_dependent_bug_to_seq_len_17(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    result = _run(pytester, run_pytest, CONFIG)
    # The fixed inputs (seq_len 12) never reach position 16: forward passes, the search fails.
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "Traceback" not in text
    assert "Divergence search: case 'window' diverges in forward; minimal example after" in text
    assert "batch 1, seq_len 17\n" in text
    assert "First divergent layer of the minimal example: model.layers.0.self_attn" in text
    match = re.search(r"\ninputs:\n  window_minimal:\n(    .*\n)+", text)
    assert match, text
    block = match.group(0).strip("\n")
    assert "    kind: ids\n" in block and "    labels: true" in block
    ids = re.search(r"input_ids: (\[\[.*\]\])", block)
    assert ids is not None
    rows = [[int(v) for v in row.split(",")] for row in re.findall(r"\[([\d, ]+)\]", ids.group(1))]
    assert [len(r) for r in rows] == [17]
    assert set(rows[0]) == {0}  # shrunk to the simplest tokens: the attention weights still differ

    # Pasted back as the case's inputs, the minimal example diverges at the same layer; its
    # first 16 tokens (a second case, same run) do not: the bug needs position 16.
    pasted = _pasted(CONFIG, block, "window_minimal")
    first16 = "[[" + ", ".join(str(v) for v in rows[0][:16]) + "]]"
    pasted = pasted.replace(
        "inputs:\n", f"inputs:\n  first16: {{kind: ids, input_ids: {first16}, labels: true}}\n", 1
    )
    pasted += "  - {name: window16, baseline: base, candidate: cand, inputs: first16}\n"
    again = _run(pytester, run_pytest, pasted)
    again.assert_outcomes(passed=1, failed=1)
    out = again.stdout.str()
    assert "FAILED align.yaml::window[forward]" in out
    assert "First divergence: model.layers.0.self_attn" in out
    assert "PASSED window16[forward]" in out


def test_search_of_an_aligned_pair_passes(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    text = CONFIG.replace(', patch: "mask_bug:patch"', "").replace(
        "max_examples: 25, batch: [1, 2], seq_len: [1, 24]}",
        "max_examples: 10, batch: [1, 2], seq_len: [1, 24], padding: true}",
    )
    result = _run(pytester, run_pytest, text, "-rA")
    result.assert_outcomes(passed=2)
