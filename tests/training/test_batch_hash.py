"""``batch_hash`` is the data the loss sees: the same rows give the same hash however they are
padded (per micro-batch to its longest row, right or left) and split into micro-batches; a row
with other ids or labels, or rows in another order, give another. ``token_count`` likewise."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from pytest_precalign.steps.step_evidence import batch_hash, batch_hashes, token_count
from pytest_precalign.trace.step_scalars import add_rows_hashes

PAD = 0
# Rows of different lengths, as a dataset gives them; one has a prompt masked out of the loss
# (labels -100 inside its attended tokens: part of what the loss sees).
ROWS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15, 16, 17, 18]]
PROMPT = {2: 1}  # row 2's first token is a prompt: label -100


def _labels(index: int, row: Sequence[int]) -> list[int]:
    skip = PROMPT.get(index, 0)
    return [-100] * skip + list(row[skip:])


def collate(rows: Sequence[Sequence[int]], first: int = 0, side: str = "right") -> dict[str, torch.Tensor]:
    """A micro-batch padded to its longest row (dynamic padding, as TRL's and transformers'
    collators pad): pad ids, labels -100 and attention_mask 0 at the padding."""
    width = max(len(r) for r in rows)
    ids, labels, mask = [], [], []
    for offset, row in enumerate(rows):
        pad = width - len(row)
        own = _labels(first + offset, row)
        before, after = (pad, 0) if side == "left" else (0, pad)
        ids.append([PAD] * before + list(row) + [PAD] * after)
        labels.append([-100] * before + own + [-100] * after)
        mask.append([0] * before + [1] * len(row) + [0] * after)
    return {
        "input_ids": torch.tensor(ids),
        "labels": torch.tensor(labels),
        "attention_mask": torch.tensor(mask),
    }


def split(rows: Sequence[Sequence[int]], size: int, side: str = "right") -> list[dict[str, torch.Tensor]]:
    return [collate(rows[k : k + size], k, side) for k in range(0, len(rows), size)]


def test_the_same_rows_in_another_micro_batch_split_hash_the_same() -> None:
    two, one = split(ROWS, 2), split(ROWS, 4)
    assert two[1]["input_ids"].shape[1] != one[0]["input_ids"].shape[1]  # padded to other lengths
    assert batch_hash(two) == batch_hash(one)
    assert batch_hash(split(ROWS, 1)) == batch_hash(one)
    assert token_count(two) == token_count(one) == 13


def test_left_and_right_padding_hash_the_same() -> None:
    assert batch_hash(split(ROWS, 4, "left")) == batch_hash(split(ROWS, 4, "right"))
    assert batch_hash(split(ROWS, 2, "left")) == batch_hash(split(ROWS, 4, "right"))


def test_other_data_hashes_differently() -> None:
    base = batch_hash(split(ROWS, 2))
    swapped = [ROWS[1], ROWS[0], *ROWS[2:]]
    assert batch_hash(split(swapped, 2)) != base  # the same rows in another order
    changed = [list(r) for r in ROWS]
    changed[3][1] = 99
    assert batch_hash(split(changed, 2)) != base  # one id
    relabelled = split(ROWS, 2)
    relabelled[1]["labels"][0, 0] = 12  # the prompt token now counted by the loss
    assert batch_hash(relabelled) != base and token_count(relabelled) == 14
    moved = [ROWS[0], [10], [11, 12, 13, 14], ROWS[3]]  # the same tokens, other row boundaries
    assert batch_hash(split(moved, 2)) != batch_hash(split([ROWS[0], [10, 11], [12, 13, 14], ROWS[3]], 2))


def test_without_a_mask_every_position_is_the_data() -> None:
    padded = split(ROWS, 4)[0]
    bare = {"input_ids": padded["input_ids"], "labels": padded["labels"]}
    assert batch_hash([bare]) != batch_hash([padded])  # the padding is data when nothing masks it
    assert token_count([{"input_ids": padded["input_ids"]}]) == 20
    assert token_count([{"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"]}]) == 14


def test_trls_collator_in_two_micro_batches_hashes_as_one_batch() -> None:
    """The issue's false "data": TRL's own collator (SFTTrainer's), padding each micro-batch."""
    sft = pytest.importorskip("trl.trainer.sft_trainer")
    collator = sft.DataCollatorForLanguageModeling(pad_token_id=PAD)
    examples = [{"input_ids": row} for row in ROWS]
    two = [collator(examples[:2]), collator(examples[2:])]
    one = [collator(examples)]
    assert two[1]["input_ids"].shape[1] != one[0]["input_ids"].shape[1]
    assert batch_hash(two) == batch_hash(one) and token_count(two) == token_count(one)
    assert batch_hash([collator(examples[::-1])]) != batch_hash(one)


def test_the_rows_hash_adds_up_over_dp_ranks_and_tells_other_rows_not_another_order() -> None:
    """``rows_hash``: the step's rows as a multiset. Two DP ranks' rows (each its own share,
    padded to its own length) add up to the one-process batch's whatever the rank split (a
    sampler's every other row) or order; other rows, or a row twice, do not."""
    one = batch_hashes(split(ROWS, 4))[1]
    # DistributedSampler's split: rank r every other row (one row a micro-batch, its own labels)
    strided = [batch_hashes([collate([ROWS[i]], i) for i in range(r, 4, 2)])[1] for r in range(2)]
    assert add_rows_hashes(strided) == one
    contiguous = [batch_hashes([collate(ROWS[:2])])[1], batch_hashes([collate(ROWS[2:], 2, "left")])[1]]
    assert add_rows_hashes(contiguous) == one
    backwards = [collate([ROWS[i]], i) for i in (3, 2, 1, 0)]
    assert batch_hashes(backwards)[1] == one and batch_hash(backwards) != batch_hash(split(ROWS, 4))
    changed = [list(r) for r in ROWS]
    changed[3][1] = 99
    assert batch_hashes(split(changed, 4))[1] != one
    assert add_rows_hashes([batch_hashes([collate(ROWS[:2])])[1]] * 2) != one  # rows 0-1 twice
    assert batch_hashes(split(ROWS, 4))[0] == batch_hash(split(ROWS, 4))  # the sequence hash as before
