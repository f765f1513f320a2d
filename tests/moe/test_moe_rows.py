"""``by_token`` on hand-made traces (numpy, no model): how rows are keyed, and what is kept
unmatched with its reason instead of being dropped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_precalign.compare.moe_tokens import MoeSpec, by_token
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.errors import ConfigError
from pytest_precalign.trace.records import Record, Trace

SPEC = MoeSpec(block="moe", experts="experts.*")


def _trace(expert_inputs: dict[str, np.ndarray], block_input: np.ndarray) -> Trace:
    """A block ``moe`` called once; each expert called once on the given rows; output = 2 * input."""
    records: list[Record] = []
    tensors: dict[str, np.ndarray] = {}

    def add(name: str, kind: str, slot: str, arr: np.ndarray) -> None:
        key = f"k{len(records)}"
        tensors[key] = arr
        phase = "forward"
        records.append(
            Record(len(records), name, "M", phase, 0, 0, kind, slot, "float32", arr.shape, tensor_key=key)  # type: ignore[arg-type]
        )

    add("moe", "input", "in.0", block_input)
    for name, rows in expert_inputs.items():
        add(f"moe.{name}", "input", "in.0", rows)
        add(f"moe.{name}", "activation", "out", rows * 2)
    add("moe", "activation", "out", block_input)
    return Trace({"record_mode": "tensor"}, tuple(records), tensors)


X = np.arange(12, dtype=np.float32).reshape(4, 3)  # 4 tokens


def _by_id(trace: Trace) -> dict[str, np.ndarray]:
    return {r.id.replace("\x00", "|"): trace.array(r) for r in trace.records}


def test_rows_in_another_order_become_the_same_record_in_token_order() -> None:
    base = _trace({"experts.0": X[[0, 2]], "experts.1": X[[1, 3, 0]]}, X)
    cand = _trace({"experts.0": X[[2, 0]], "experts.1": X[[3, 0, 1]]}, X)
    keyed = by_token(base, cand, SPEC)
    a, b = _by_id(keyed.baseline), _by_id(keyed.candidate)
    assert a.keys() == b.keys()
    for rid in a:
        np.testing.assert_array_equal(a[rid], b[rid])
    out0 = [v for k, v in a.items() if k.startswith("moe.experts.0") and "activation" in k]
    np.testing.assert_array_equal(out0[0], X[[0, 2]] * 2)
    assert keyed.reasons == {}


def test_a_row_that_is_no_token_of_the_block_is_unmatched_with_the_reason() -> None:
    base = _trace({"experts.0": X[[0, 1]]}, X)
    cand = _trace({"experts.0": np.stack([X[0], X[1] + 0.5])}, X)
    keyed = by_token(base, cand, SPEC)
    lone = [rid for rid in keyed.reasons if "@row1" in rid]
    assert lone and all("matches no token of moe's input" in keyed.reasons[r] for r in lone)
    # Kept, not dropped: the candidate trace still holds that row.
    assert any("@row1" in r.slot for r in keyed.candidate.records)
    # Token 1 reached expert 0 on the baseline only: a routing difference, also kept with a reason.
    routing = [r for r in keyed.candidate.records if r.name == "moe.routing"]
    assert len(routing) == 1
    assert any("routed differently" in why for why in keyed.reasons.values())


def test_an_empty_slice_and_a_leading_batch_dim_change_nothing() -> None:
    """A sort dispatcher calling every expert (one on no rows), with ``[1, n, hidden]`` inputs."""
    base = _trace({"experts.0": X[[0, 2, 1, 3]], "experts.1": X[[1]]}, X)
    cand = _trace(
        {"experts.0": X[[0, 1, 2, 3]][None], "experts.1": X[[1]][None], "experts.2": X[:0]}, X[None]
    )
    keyed = by_token(base, cand, SPEC)
    a, b = _by_id(keyed.baseline), _by_id(keyed.candidate)
    expert_ids = {k for k in a if k.startswith("moe.experts")}
    assert expert_ids and expert_ids == {k for k in b if k.startswith("moe.experts")}
    for rid in expert_ids:
        np.testing.assert_array_equal(a[rid], b[rid])
    assert keyed.reasons == {}
    routing = [r for r in (*keyed.baseline.records, *keyed.candidate.records) if r.name == "moe.routing"]
    assert len({r.crc32 for r in routing}) == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            MoeSpec(block="layers.*.mlp"),
            r"record.moe.block 'layers.\*.mlp' matched no module input recorded by the baseline",
        ),
        (
            MoeSpec(block="moe", experts="expert_*"),
            r"record.moe.experts 'expert_\*' matched no module called inside 'moe'",
        ),
    ],
)
def test_a_moe_glob_matching_nothing_is_an_error(spec: MoeSpec, message: str) -> None:
    trace = _trace({"experts.0": X[[0, 1]]}, X)
    with pytest.raises(ConfigError, match=message):
        by_token(trace, trace, spec)


BAD = """\
version: 1
models:
  a: {source: factory, factory: "nets:build"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 3, vocab_size: 4}
cases:
  - {name: c, baseline: a, candidate: a, inputs: toks, record: RECORD}
"""


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ('{moe: {block: "m.*.mlp"}}', r"align.yaml:7: cases\[0\].record.moe: needs mode: tensor"),
        ('{mode: tensor, moe: {experts: "experts.*"}}', r"cases\[0\].record.moe.*block"),
        ('{mode: tensor, moe: {block: "m", expert: "e.*"}}', r"cases\[0\].record.moe.*expert"),
        ('{mode: tensor, moe: {block: "m"}}, isolate: true', r"cases\[0\].isolate: .*not with record: \{moe"),
    ],
)
def test_a_bad_moe_key_is_one_message_naming_it(tmp_path: Path, record: str, message: str) -> None:
    path = tmp_path / "align.yaml"
    path.write_text(BAD.replace("RECORD", record), encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as excinfo:
        load_config_file(path)
    assert "align.yaml" in str(excinfo.value)
    assert "\n" not in str(excinfo.value).strip()


def test_a_good_moe_key_is_a_spec(tmp_path: Path) -> None:
    path = tmp_path / "align.yaml"
    path.write_text(BAD.replace("RECORD", '{mode: tensor, moe: {block: "m.*.mlp"}}'), encoding="utf-8")
    case = load_config_file(path).case("c")
    assert case.record.moe == MoeSpec(block="m.*.mlp", experts="experts.*")
