"""The tool's own bookkeeping files in a baseline folder are never followed through links
(issue #26 item 3): a link planted as ``.<case>.<x>.old`` or ``.<case>.lock`` cannot make
recovery or locking write outside the folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_precalign.baseline.store import case_lock, recover
from pytest_precalign.errors import TraceError


def test_recover_does_not_follow_a_planted_old_link(tmp_path: Path) -> None:
    root = tmp_path / "baselines"
    root.mkdir()
    outside = tmp_path / "elsewhere"
    (outside / "old").mkdir(parents=True)
    (outside / "old" / "secret.txt").write_text("not the tool's")
    os.symlink(outside, root / ".case.x1y2.old")

    assert recover(root, "case") == []
    assert (outside / "old" / "secret.txt").read_text() == "not the tool's"  # not moved
    assert not os.path.lexists(root / "case")


def test_recover_does_not_follow_an_old_link_inside_a_real_aside_folder(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "data.txt").write_text("x")
    aside = tmp_path / ".case.a1b2.old"
    aside.mkdir()
    os.symlink(outside, aside / "old")
    recover(tmp_path, "case")
    assert not os.path.lexists(tmp_path / "case") and (outside / "data.txt").read_text() == "x"


def test_case_lock_does_not_open_a_planted_link(tmp_path: Path) -> None:
    root = tmp_path / "baselines"
    root.mkdir()
    outside = tmp_path / "created-outside"
    os.symlink(outside, root / ".case.lock")
    with pytest.raises(TraceError) as info, case_lock(root, "case"):
        pass
    assert not outside.exists()
    assert str(info.value).startswith(f"{root / '.case.lock'}: cannot open the case's lock file")
    assert "not a link: remove it" in str(info.value)


def test_case_lock_still_locks(tmp_path: Path) -> None:
    with case_lock(tmp_path, "case"):
        assert (tmp_path / ".case.lock").is_file()
    with case_lock(tmp_path, "case"):  # taken again once released
        pass
