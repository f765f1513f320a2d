"""``field_dict``: the one key-per-field ``as_dict`` (records, statistics, plans, note blocks) writes
the JSON those classes wrote by hand: field order, lists for tuples, nested dataclasses."""

from __future__ import annotations

import json

from pytest_precalign.trace.json_fields import field_dict
from pytest_precalign.trace.note_blocks import DpJoin, JoinedPart
from pytest_precalign.trace.records import Record, Stats
from pytest_precalign.trace.training_record import TrainingPlan


def _record(merged: tuple[str, ...] = ()) -> Record:
    return Record(
        seq=3,
        name="model.fc",
        module_class="Linear",
        phase="forward",
        step=0,
        call=1,
        kind="activation",
        slot="out",
        dtype="float32",
        shape=(2, 4),
        stats=Stats(1.0, -1.0, 0.5, 2.0, nan=1),
        deps=("a|activation|out|0|0",),
        merged=merged,
    )


def test_a_record_is_its_fields_in_order_with_its_statistics_nested() -> None:
    out = _record().as_dict()
    assert json.dumps(out) == json.dumps(
        {
            "seq": 3,
            "name": "model.fc",
            "module_class": "Linear",
            "phase": "forward",
            "step": 0,
            "call": 1,
            "kind": "activation",
            "slot": "out",
            "dtype": "float32",
            "shape": [2, 4],
            "stats": {"max": 1.0, "min": -1.0, "mean": 0.5, "norm": 2.0, "nan": 1, "inf": 0},
            "crc32": None,
            "tensor_key": None,
            "deps": ["a|activation|out|0|0"],
        }
    )
    assert list(_record(merged=("q", "k")).as_dict())[-1] == "merged"
    assert _record(merged=("q", "k")).as_dict()["merged"] == ["q", "k"]


def test_nested_tuples_become_lists_and_none_stays() -> None:
    plan = TrainingPlan("sgd", lr=((0.1, 0.2), (0.05, 0.1)), weight_decay=(0.0, 0.1), groups=(("w",), ("b",)))
    out = plan.as_dict()
    assert out["lr"] == [[0.1, 0.2], [0.05, 0.1]] and out["groups"] == [["w"], ["b"]]
    assert out["betas"] is None and list(out)[:4] == ["optimizer", "lr", "weight_decay", "groups"]
    assert TrainingPlan("adam", (), (), (), betas=(0.9, 0.99)).as_dict()["betas"] == [0.9, 0.99]


def test_omit_leaves_a_field_out_and_mappings_of_dataclasses_are_plain() -> None:
    part = JoinedPart("rank0", 2, 0, {"max": 1.0})
    join = DpJoin(2, True, (0.5, 0.5), 1, {"x": "why"}, {"r": (part,)})
    assert join.to_json()["parts"] == {"r": [{"where": "rank0", "rows": 2, "dim": 0, "stats": {"max": 1.0}}]}
    assert list(field_dict(join, omit=("parts", "unpaired"))) == [
        "replicas",
        "joined",
        "weights",
        "records_joined",
    ]
