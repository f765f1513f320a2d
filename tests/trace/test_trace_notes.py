"""A trace's notes and run record, typed (``TraceNotes``, ``Trace.run``): read once by the loader
(a note of the wrong shape is a ``TraceError`` naming the file and the key, at load), changed
through ``with_notes`` / ``with_run`` with the manifest written to disk kept the same."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_precalign.errors import TraceError
from pytest_precalign.trace.native_io import read_trace, write_trace
from pytest_precalign.trace.note_blocks import IncompleteStep, MissingGrads
from pytest_precalign.trace.records import Record, Stats, Trace
from pytest_precalign.trace.step_scalars import StepScalars
from pytest_precalign.trace.trace_notes import NOTE_KEYS, TraceNotes
from pytest_precalign.trace.training_record import RunRecord
from tests.helpers.files import reseal

MISSING = MissingGrads(step=1, rank=0, count=2, names=("w", "b"), why="zeroed")
MISSING_JSON = {"step": 1, "rank": 0, "count": 2, "names": ["w", "b"], "why": "zeroed"}
# Every nested block as its writer writes it (``note_blocks``): read typed, written back the same.
BLOCKS = {
    "incomplete_steps": [{"step": 2, "detail": "rank1/ was never published"}],
    "grads_missing": [MISSING_JSON],
    "replica_mismatches": [
        {"record": "w|param||0|0", "name": "w", "kind": "param", "phase": "step", "step": 0,
         "kept": "rank0", "differ": ["rank1"], "detail": "max 1 vs max 2"}
    ],
    "dp_join": {
        "0": {"replicas": 2, "joined": True, "weights": [0.25, 0.75], "records_joined": 1,
              "unpaired": {"w|param_grad||0|0": "partial grads"},
              "parts": {"m|activation|out|0|0": [
                  {"where": "rank0", "rows": 1, "dim": 0,
                   "stats": {"max": 1.0, "min": 0, "mean": 0.5, "norm": 1.0, "nan": 0, "inf": 0}},
                  {"where": "rank1", "rows": 3, "dim": 0, "stats": None}]}},
        "1": {"replicas": 2, "joined": False},
    },
    "tp_partials": {"0": {"mlp.down": {"0": [[0.5, -0.4, 0.02, 1], None], "1": [[0.25, -0.3, 0.04, 0.8]]}}},
    "compiled": {"stats": "in the graph", "not_recorded": {"grad_input": "not in the graph"}, "forward": "x"},
}  # fmt: skip


def _trace(manifest: dict[str, object]) -> Trace:
    record = Record(
        0, "lin", "Linear", "forward", 0, 0, "activation", "out", "float32", (2,), Stats(1, 0, 0.5, 1)
    )
    return Trace({"record_mode": "stats", **manifest}, (record,))


def test_notes_round_trip_through_the_manifest_on_disk(tmp_path: Path) -> None:
    noted = _trace({"case": "c"}).with_notes(
        grads_missing=(MISSING,), not_trained="stopped", dp_split={"0": "rows"}, param_grads="step"
    )
    assert noted.manifest["grads_missing"] == [MISSING_JSON] and noted.manifest["not_trained"] == "stopped"
    assert "replica_mismatches" not in noted.manifest  # an empty note writes no key
    write_trace(noted, tmp_path / "tr")
    back = read_trace(tmp_path / "tr")
    assert back.notes == noted.notes
    assert back.notes.to_manifest() == {k: v for k, v in back.manifest.items() if k in NOTE_KEYS}
    cleared = back.with_notes(grads_missing=())
    assert "grads_missing" not in cleared.manifest and cleared.notes.not_trained == "stopped"


def test_with_run_rewrites_the_run_record_and_keeps_the_notes() -> None:
    scalars = {0: StepScalars(0, loss=1.5), 1: StepScalars(1, loss=1.25)}
    trace = _trace({}).with_notes(not_trained="x").with_run(RunRecord(scalars=scalars))
    assert trace.scalars == scalars and trace.notes.not_trained == "x"
    assert sorted(trace.manifest["scalars"]) == ["0", "1"]
    only = trace.with_run(RunRecord(scalars={1: scalars[1]}))
    assert list(only.scalars) == [1] and list(only.manifest["scalars"]) == ["1"]
    assert "scalars" not in only.with_run(RunRecord()).manifest


@pytest.mark.parametrize(
    ("note", "value", "said"),
    [
        ("grads_missing", {"step": 1}, "'grads_missing' must be a list, got dict"),
        ("replica_mismatches", [3], r"replica_mismatches\[0\] must be a mapping, got int"),
        ("steps", [0, "one"], r"steps\[1\] must be a step number, got 'one'"),
        ("not_recordable", ["a"], "'not_recordable' must be a mapping, got list"),
        (
            "incomplete_steps",
            [{"step": "2", "detail": "x"}],
            r"incomplete_steps\[0\]\['step'\] must be an integer, got '2'",
        ),
        (
            "dp_join",
            {"0": {"replicas": 2}},
            r"dp_join\['0'\]\['joined'\] must be true or false, it is missing",
        ),
        (
            "tp_partials",
            {"0": {"m": {"0": [["a"]]}}},
            r"tp_partials\['0'\]\['m'\]\['0'\] must be a list of \[max",
        ),
    ],
)
def test_a_note_of_the_wrong_shape_fails_the_load_naming_file_and_key(
    tmp_path: Path, note: str, value: object, said: str
) -> None:
    write_trace(_trace({}), tmp_path / "tr")
    manifest_file = tmp_path / "tr" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest_file.write_text(json.dumps({**manifest, note: value}))
    reseal(manifest_file)  # crafted and sealed again: the notes' own check refuses it
    with pytest.raises(TraceError, match=f"{manifest_file}: {said}"):
        read_trace(tmp_path / "tr")


def test_a_trace_made_in_memory_reads_its_notes_from_its_manifest() -> None:
    trace = _trace({"incomplete_steps": [{"step": 2, "detail": "rank1/ is missing"}], "steps": [0, 1]})
    assert trace.notes == TraceNotes(
        steps=(0, 1), incomplete_steps=(IncompleteStep(step=2, detail="rank1/ is missing"),)
    )


def test_a_trace_made_in_memory_with_a_malformed_note_is_refused_when_made() -> None:
    """The notes are held from construction: a builder that puts a note of the wrong shape in
    a manifest is told at once, not by whichever stage reads the note later."""
    with pytest.raises(TraceError, match=r"manifest: incomplete_steps\[0\]\['step'\] must be an integer"):
        _trace({"incomplete_steps": [{"step": "2", "detail": "x"}]})


def test_a_trace_made_from_another_with_a_new_manifest_reads_that_manifest_notes() -> None:
    trace = _trace({"steps": [0, 1]})
    moved = replace(trace, manifest={**trace.manifest, "steps": [0, 1, 2]})
    assert moved.notes.steps == (0, 1, 2)
    assert trace.with_records(trace.records).notes is trace.notes


def test_every_nested_block_is_read_typed_and_written_back_byte_for_byte(tmp_path: Path) -> None:
    write_trace(_trace(BLOCKS), tmp_path / "tr")
    notes = read_trace(tmp_path / "tr").notes
    assert notes.dp_join["0"].parts["m|activation|out|0|0"][1].rows == 3 and not notes.dp_join["1"].joined
    assert notes.replica_mismatches[0].differ == ("rank1",) and notes.grads_missing == (MISSING,)
    assert notes.tp_partials["0"].of("mlp.down") == {
        "0": ((0.5, -0.4, 0.02, 1), None),
        "1": ((0.25, -0.3, 0.04, 0.8),),
    }
    assert notes.compiled is not None and notes.compiled.not_recorded == {"grad_input": "not in the graph"}
    assert json.dumps(notes.to_manifest()) == json.dumps(BLOCKS)
