"""A new batch each optimizer step: tokens from their seed, dataset rows, a factory's iterable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.config.specs import InputSpec
from pytest_precalign.errors import CaseError, SourceError
from pytest_precalign.sources.inputs import build_inputs, inputs_digest


def test_tokens_draw_a_new_batch_per_step_and_step_zero_is_unchanged(tmp_path: Path) -> None:
    spec = InputSpec(name="t", kind="tokens", batch=2, seq_len=4, vocab_size=50, seed=3, labels=True)
    one = build_inputs(spec, tmp_path)
    three = build_inputs(spec, tmp_path, 3)
    assert torch.equal(one.model_inputs["input_ids"], three.batch(0).model_inputs["input_ids"])
    ids = [three.batch(s).model_inputs["input_ids"] for s in range(3)]
    assert not torch.equal(ids[0], ids[1]) and not torch.equal(ids[1], ids[2])
    assert torch.equal(three.batch(2).labels, ids[2])
    again = build_inputs(spec, tmp_path, 3)  # the same batches on the other side
    assert all(torch.equal(again.batch(s).model_inputs["input_ids"], ids[s]) for s in range(3))
    assert inputs_digest(one) != inputs_digest(three)
    assert one.batch(5) == one.batch(0)  # one batch: used at every step


def test_dataset_rows_in_file_order(tmp_path: Path) -> None:
    rows = ((1, 2), (3, 4), (5, 6), (7, 8))
    spec = InputSpec(name="d", kind="dataset", batch=2, seq_len=2, labels=True, input_ids=rows)
    data = build_inputs(spec, tmp_path, 2)
    assert data.batch(1).model_inputs["input_ids"].tolist() == [[5, 6], [7, 8]]
    with pytest.raises(CaseError, match="3 step\\(s\\) of batch 2 need 6 rows, the file has 4"):
        build_inputs(spec, tmp_path, 3)


def test_factory_iterable_gives_batch_s_its_item_and_a_short_stream_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "batches.py").write_text(
        "import torch\n"
        "def make(n):\n"
        "    for k in range(n):\n"
        "        yield {'input_ids': torch.full((1, 3), k)}\n"
    )
    spec = InputSpec(name="f", kind="factory", factory="batches:make", kwargs={"n": 3}, labels=True)
    data = build_inputs(spec, tmp_path, 3)
    assert [int(data.batch(s).model_inputs["input_ids"][0, 0]) for s in range(3)] == [0, 1, 2]
    assert torch.equal(data.batch(2).labels, torch.full((1, 3), 2))
    with pytest.raises(CaseError, match="steps 4 is beyond the data: batches:make gave 3 batch"):
        build_inputs(spec, tmp_path, 4)
    bad = InputSpec(name="f", kind="factory", factory="batches:make", kwargs={"n": "x"})
    with pytest.raises(SourceError):
        build_inputs(bad, tmp_path, 1)
