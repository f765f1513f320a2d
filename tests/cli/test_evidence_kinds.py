"""``precalign compare`` on runs recorded in modes whose evidence cannot be compared (issue #25,
item 2): a hash-mode baseline against a buggy stats-mode candidate, tensor values against
checksums. Neither passes: nothing was compared, and the message says why."""

from __future__ import annotations

import pytest

from pytest_precalign.cli import main

from .test_compare import _record


@pytest.mark.parametrize(
    ("base_mode", "cand_mode", "words"),
    [
        ("hash", "stats", "CRC-32 checksum vs statistics"),
        ("tensor", "hash", "tensor values vs CRC-32 checksum"),
    ],
)
def test_runs_in_incomparable_modes_fail_saying_why(tmp_path, capsys, base_mode, cand_mode, words):
    a = _record(tmp_path, "a", mode=base_mode)
    b = _record(tmp_path, "b", bump=5.0, mode=cand_mode)  # a real bug the evidence cannot see
    assert main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "PASSED" not in out
    assert f"cannot be compared ({words})" in out
