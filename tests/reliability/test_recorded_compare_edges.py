"""Issue #47, item 3: recorded-run compare across modes and formats. Disjoint step sets fail
closed saying the runs do not line up; a scalars-mode run against a stats-mode one is judged on
what both hold, saying what was not compared; the Recorder's manifest beside an msprobe
dump.json removed or of the wrong type is one message naming it (before: removed and resealed,
a "manifest.json" that is not there was named; of the wrong type in every step, the root was
taken for msprobe's own dump set, "holds 4 msprobe rank folders")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from tests.helpers.files import reseal

from .crafted_runs import copied, record

SIDECAR = "precalign_manifest.json"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("edges")
    return {
        "scalars": record(base / "scalars", mode="scalars"),
        "stats": record(base / "stats", mode="stats"),
        "msprobe": record(base / "msprobe", mode="stats", fmt="msprobe"),
        "late": record(base / "late", mode="scalars", first=2),
    }


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["compare", str(a), str(b)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.err.strip() if code == 2 else captured.out


def test_disjoint_step_sets_fail_closed(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    early = copied(runs["scalars"], tmp_path / "early")
    for step in (2, 3):
        shutil.rmtree(early / f"step{step}")
    code, out = _compare(early, runs["late"], capsys)  # steps 0, 1 against steps 2, 3
    assert code == 1 and "steps 0-1 recorded by the baseline only: the runs' steps do not line up" in out, out


def test_scalars_against_layers_are_judged_on_what_both_hold(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _compare(runs["scalars"], runs["stats"], capsys)
    assert code == 0, out
    assert "not compared: the layers of step(s) 0, 1, 2, 3: the candidate recorded them" in out, out


@pytest.mark.parametrize("how", ["removed", "a list", "removed and resealed", "a list in every step"])
def test_the_recorders_manifest_beside_an_msprobe_dump_damaged_is_named(
    how: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    side = copied(runs["msprobe"], tmp_path / "side")
    file = side / "step1" / "rank0" / SIDECAR
    if how.startswith("a list"):
        for step in range(4) if how.endswith("every step") else [1]:
            file = side / f"step{step}" / "rank0" / SIDECAR
            file.write_text("[1, 2]")
            reseal(file)
        file = side / "step0" / "rank0" / SIDECAR if how.endswith("every step") else file
    else:
        file.unlink()
        if how == "removed and resealed":  # crafted elsewhere: the checksums then agree
            reseal(file.parent)
    code, err = _compare(runs["msprobe"], side, capsys)
    assert code == 2 and "\n" not in err, err
    if how.startswith("a list"):
        assert err == f"precalign: error: {file}: expected a JSON object (the Recorder's trace manifest)"
    elif how == "removed":
        assert err.startswith(f"precalign: error: {file}: listed in checksums.json but missing"), err
    else:  # steps 0, 2, 3 still hold it: the step without one is named
        assert err == f"precalign: error: {file}: missing (its sibling rank folders have one)", err
