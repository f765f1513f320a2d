"""Data-parallel replicas that trained on different rows join into the one-process run's
records (``parallel/dp_join.py``, ``parallel/dp_scalars.py``); replicas that must agree and do
not are findings naming the rank. Synthetic traces: numbers whose merge is known by hand."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.errors import ConfigError, TraceError
from pytest_precalign.parallel.dp_join import Replica, join_replicas, split_rows
from pytest_precalign.parallel.dp_scalars import join_scalars
from pytest_precalign.parallel.layout import ParallelLayout, parse_parallel_option
from pytest_precalign.parallel.merge import RankTrace, merge_ranks
from pytest_precalign.parallel.sides import load_parallel_side
from pytest_precalign.reports.training_evidence_text import DP_STATS_ONLY, evidence_text
from pytest_precalign.trace.native_io import write_trace
from pytest_precalign.trace.records import Record, Stats, Trace
from pytest_precalign.trace.step_scalars import JOINED_HASH, StepScalars, scalars_manifest, scalars_of
from pytest_precalign.trace.training_record import read_run_record
from pytest_precalign.verdict.dp_rows import with_replica_rows
from pytest_precalign.verdict.run_evidence import GradsScaled
from pytest_precalign.verdict.training_run import FirstDivergent, TrainingVerdict


def _stats(a: np.ndarray) -> Stats:
    return Stats(float(a.max()), float(a.min()), float(a.mean()), float(np.linalg.norm(a)))


def _rec(seq: int, name: str, kind: str, a: np.ndarray | None, key: str | None, **kw: Any) -> Record:
    phase = {"param": "step", "param_grad": "backward", "grad_output": "backward"}.get(kind, "forward")
    shape = kw.pop("shape", tuple(a.shape) if a is not None else ())
    stats = _stats(a) if a is not None and kw.pop("stats", True) else None
    return Record(
        seq,
        name,
        "M",
        phase,
        0,
        0,
        kind,
        kw.pop("slot", "out"),
        "float32",
        shape,
        stats,
        tensor_key=key,
        **kw,
    )  # type: ignore[arg-type]


def _rank(
    rank: int,
    rows: np.ndarray,
    *,
    tokens: int,
    hash_: str,
    grad_norm: float = 2.0,
    param: float = 1.0,
    act_shift: float = 0.0,
) -> RankTrace:
    """One DP rank's step: model input (its rows), an activation, its grad, a broadcast
    position table (the same on each rank), a hash-only record, its loss, a partial grad and the
    parameter after the step."""
    act = rows * 2.0 + act_shift
    grad = rows + 0.5
    pos = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    weight = np.full((2, 2), param, dtype=np.float32)
    partial = np.full((2, 2), float(rank + 1), dtype=np.float32)
    loss = np.array(rows.mean(), dtype=np.float32)
    tensors = {"in": rows, "act": act, "grad": grad, "pos": pos, "w": weight, "pg": partial, "loss": loss}
    records = (
        _rec(0, "model", "input", rows, "in", slot="in.0"),
        _rec(1, "model.pos", "activation", pos, "pos"),
        _rec(2, "model.layer", "activation", act, "act"),
        _rec(3, "model.hashed", "activation", act, None, stats=False, crc32=f"{rank:08x}"),
        _rec(4, "loss", "loss", loss, "loss", slot=""),
        _rec(5, "model.layer", "grad_output", grad, "grad"),
        _rec(6, "w", "param_grad", partial, "pg", slot=""),
        _rec(7, "w", "param", weight, "w", slot=""),
    )
    scalars = StepScalars(
        0, loss=float(loss), lr=(0.1,), grad_norm=grad_norm, tokens=tokens, batch_hash=hash_
    )
    manifest = {
        "step": 0,
        "param_grads": "backward",
        "record_mode": "tensor",
        "parallel": {"dp": 2, "dp_rank": rank, "rank": rank, "world_size": 2},
        "scalars": scalars_manifest({0: scalars}),
    }
    return RankTrace(rank, f"rank{rank}", Trace(manifest, records, tensors, read_run_record(manifest)))


def _rows(rank: int) -> np.ndarray:
    return (np.arange(12, dtype=np.float32).reshape(2, 3, 2) + 12 * rank) / 10


def _joined(**rank1: Any) -> Trace:
    ranks = [
        _rank(0, _rows(0), tokens=6, hash_="aa"),
        _rank(1, _rows(1), tokens=rank1.pop("tokens", 6), hash_="bb", **rank1),
    ]
    return merge_ranks(ranks, ParallelLayout(dp=2), where="step0")


def test_replicas_that_saw_other_rows_join_along_the_batch() -> None:
    merged = _joined(tokens=18)  # rank 1's share of the global loss: 18 / 24
    by_id = {r.id: r for r in merged.records}
    whole = np.concatenate([_rows(0), _rows(1)])
    layer = by_id["model.layer|activation|out|0|0"]
    assert layer.shape == (4, 3, 2)
    assert layer.stats is not None and math.isclose(
        layer.stats.norm, float(np.linalg.norm(whole * 2)), rel_tol=1e-6
    )
    np.testing.assert_array_equal(merged.array(layer), whole * 2)
    # The backward of each rank's loss, scaled by its share of the global loss (1/4 and 3/4).
    grad = by_id["model.layer|grad_output|out|0|0"]
    expected = np.concatenate([(_rows(0) + 0.5) * 0.25, (_rows(1) + 0.5) * 0.75])
    np.testing.assert_allclose(merged.array(grad), expected, rtol=1e-6)
    assert grad.stats is not None and math.isclose(grad.stats.max, float(expected.max()), rel_tol=1e-6)
    loss = by_id["loss|loss||0|0"]
    assert loss.stats is not None
    assert math.isclose(
        loss.stats.mean, 0.25 * float(_rows(0).mean()) + 0.75 * float(_rows(1).mean()), rel_tol=1e-6
    )
    assert by_id["model.pos|activation|out|0|0"].shape == (1, 3, 2)  # the same on each rank: kept once
    # Partial grads: per replica, never joined, listed with the reason; the parameter kept once.
    assert "w|param_grad||0|0" not in by_id
    assert {"w|param_grad|dp0|0|0", "w|param_grad|dp1|0|0"} <= set(by_id)
    np.testing.assert_array_equal(merged.array(by_id["w|param_grad|dp1|0|0"]), np.full((2, 2), 2.0))
    block = merged.manifest["dp_join"]["0"]
    assert block["joined"] is True and block["replicas"] == 2 and block["weights"] == [0.25, 0.75]
    assert "partial grad" in block["unpaired"]["w|param_grad||0|0"]
    assert "hash of the joined batch" in block["unpaired"]["model.hashed|activation|out|0|0"]
    assert "replica_mismatches" not in merged.manifest


def test_a_replica_whose_parameter_differs_is_a_finding_naming_its_rank() -> None:
    merged = _joined(param=1.5)
    (found,) = merged.manifest["replica_mismatches"]
    assert (found["name"], found["kind"], found["kept"], found["differ"]) == (
        "w",
        "param",
        "rank0",
        ["rank1"],
    )


def test_replicas_that_saw_the_same_rows_are_copies_checked_record_by_record() -> None:
    same = [_rank(r, _rows(0), tokens=6, hash_="aa", param=1.0 + r) for r in range(2)]
    merged = merge_ranks(same, ParallelLayout(dp=2), where="step0")
    assert merged.manifest["dp_join"]["0"]["joined"] is False
    assert next(r for r in merged.records if r.kind == "input").shape == (2, 3, 2)  # not joined
    noted = {(m["name"], m["kind"], tuple(m["differ"])) for m in merged.manifest["replica_mismatches"]}
    # (this rank's hash and partial grad are made to differ from rank 0's, its parameter too)
    assert noted == {
        (n, k, ("rank1",)) for n, k in [("model.hashed", "activation"), ("w", "param_grad"), ("w", "param")]
    }
    different = [_rank(0, _rows(0), tokens=6, hash_="aa"), _rank(1, _rows(1), tokens=6, hash_="bb")]
    with pytest.raises(TraceError, match="saw different data .* replicas=same refuses"):
        merge_ranks(different, ParallelLayout(dp=2), where="step0", replica_mode="same")


def test_shapes_that_differ_beyond_the_batch_are_listed_not_joined() -> None:
    padded = _rank(1, np.ones((2, 4, 2), dtype=np.float32), tokens=8, hash_="bb")
    merged = merge_ranks([_rank(0, _rows(0), tokens=6, hash_="aa"), padded], ParallelLayout(dp=2), where="s")
    unpaired = merged.manifest["dp_join"]["0"]["unpaired"]
    assert "shapes differ beyond the batch dim" in unpaired["model.layer|activation|out|0|0"]
    assert "model.layer|activation|out|0|0" not in {r.id for r in merged.records}


def test_scalars_are_the_global_steps_and_replicas_that_disagree_are_named() -> None:
    manifests = [
        ("rank0", _rank(0, _rows(0), tokens=6, hash_="aa" * 32).trace.scalars),
        ("rank1", _rank(1, _rows(1), tokens=18, hash_="bb" * 32, grad_norm=3.0).trace.scalars),
    ]
    joined, findings = join_scalars(manifests, joined=True)
    assert joined is not None
    step = joined[0]
    assert step.tokens == 24
    assert step.loss is not None
    assert math.isclose(
        step.loss, 0.25 * float(_rows(0).mean()) + 0.75 * float(_rows(1).mean()), rel_tol=1e-6
    )
    assert step.batch_hash is not None and step.batch_hash.startswith(JOINED_HASH)
    assert step.grad_norm == 2.0  # replica 0's, kept
    assert [(f.name, f.step, f.differ) for f in findings] == [("step scalar grad_norm", 0, ("rank1",))]
    # Copies (same rows) must agree on the loss too.
    _, findings = join_scalars([manifests[0], ("rank1", manifests[1][1])], joined=False)
    assert {f.name for f in findings} >= {"step scalar loss", "step scalar grad_norm"}


def test_sides_that_split_the_batch_otherwise_are_listed_by_step() -> None:
    joined = _joined()
    one = Trace({"step": 0}, tuple(r for r in joined.records if r.kind == "param"))
    calls = [
        Record(i, "model", "M", "forward", 0, i, "input", "in.0", "float32", (2, 3, 2)) for i in range(2)
    ]
    two_micro = Trace({"step": 0}, (*calls, *one.records))
    assert split_rows(two_micro, joined) == {
        0: "the baseline's one replica x 2 micro-batches, the candidate's 2 DP replicas joined x 1 micro-batch"
    }
    assert split_rows(Trace({"step": 0}, (calls[0], *one.records)), joined) == {}  # one call each: same rows


def test_the_replicas_option_is_checked() -> None:
    side, layout = parse_parallel_option("candidate:replicas=joined")
    assert (side, layout.replicas) == ("candidate", "joined")
    with pytest.raises(ConfigError, match="replicas='both': expected one of auto, joined, same"):
        parse_parallel_option("candidate:replicas=both")


def _rows_told(baseline: Trace, candidate: Trace) -> str:
    """The run verdict's evidence when ``model.layer``'s activation is its first divergence."""
    comparison = compare_traces(baseline, candidate, default_table())
    first = FirstDivergent(0, "forward", "model.layer", GradsScaled(0, 4, 2.0))
    verdict = with_replica_rows(TrainingVerdict(1, "approximate", first), baseline, candidate, comparison)
    assert verdict is not None and verdict.first is not None
    return evidence_text(verdict.first.evidence)


def test_a_joined_activation_that_diverges_names_the_rank_whose_rows_differ() -> None:
    base, stale = _joined(), _joined(act_shift=0.5)  # rank 1 computed the layer differently
    told = _rows_told(base, stale)  # tensors: each replica's rows against the baseline's same rows
    assert "the candidate's DP rank(s) rank1 computed it differently" in told
    assert "DP rank rank0 (rows 0-1 of the global batch) within tolerance" in told
    assert "DP rank rank1 (rows 2-3 of the global batch) differs: allclose 0.5" in told
    # Statistics only, both sides the same DP split (a rerun): each replica's statistics.
    base_stats, stale_stats = (t.with_records(t.records, {}) for t in (base, stale))
    told = _rows_told(base_stats, stale_stats)
    assert "DP rank(s) rank1 computed it differently" in told and "differs: stats.max 0.5" in told
    # Statistics only against a run that split the batch otherwise: said, not guessed.
    one = Trace({k: v for k, v in base.manifest.items() if k != "dp_join"}, base.records, {}, base.run)
    assert _rows_told(one, stale_stats).endswith(DP_STATS_ONLY)
    assert "DP rank" not in _rows_told(base, _joined())  # nothing failed: nothing added


def test_a_megatron_runs_replicas_join_on_the_dim_that_holds_their_rows() -> None:
    """Megatron's hidden states are ``[s, b, h]`` beside ``[b, s]`` token ids, ``[b, s, h]`` word
    embeddings and ``[b, heads, s, s]`` scores: each joined on its batch dim (the replica's
    rows), a table the same on each replica (``[s, 1, 1, d]`` rotary) kept once."""
    shapes = {
        "gpt in": ("input", (1, 16)),
        "embedding.word_embeddings": ("activation", (1, 16, 8)),
        "rotary_pos_emb": ("activation", (16, 1, 1, 4)),
        "decoder.layers.0": ("activation", (16, 1, 8)),
        "decoder.layers.0.self_attention.core_attention": ("activation", (1, 4, 16, 16)),
        "decoder.layers.0.mlp": ("activation", (16, 3, 8)),  # no dim holds the replica's 1 row
    }

    def replica(rank: int) -> Replica:
        records = [
            _rec(i, name, kind, np.full(shape, 0.5 if name == "rotary_pos_emb" else 1.0 + rank), None)
            for i, (name, (kind, shape)) in enumerate(shapes.items())
        ]
        return Replica(f"step0/rank{rank}", records, {})

    joined = join_replicas([replica(0), replica(1)], grads_reduced=True, where="step0", seq_first=True)
    got = {r.name: r.shape for r in joined.records}
    assert got == {
        "gpt in": (2, 16),
        "embedding.word_embeddings": (2, 16, 8),
        "rotary_pos_emb": (16, 1, 1, 4),
        "decoder.layers.0": (16, 2, 8),
        "decoder.layers.0.self_attention.core_attention": (2, 4, 16, 16),
    }
    assert "cannot be joined" in joined.unpaired["decoder.layers.0.mlp|activation|out|0|0"]
    hidden = joined.parts["decoder.layers.0|activation|out|0|0"]
    assert [(p.where, p.rows, p.dim) for p in hidden] == [
        ("step0/rank0", 1, 1),
        ("step0/rank1", 1, 1),
    ]
    # Not a Megatron run: dim 0, as before.
    plain = join_replicas([replica(0), replica(1)], grads_reduced=True, where="step0")
    assert {r.name: r.shape for r in plain.records}["decoder.layers.0"] == (32, 1, 8)


def test_a_step_recorded_as_scalars_only_joins_its_replicas_by_the_runs_layout(tmp_path: Path) -> None:
    """``steps=`` left step 0 out: its rank folders hold the scalars alone, no ``parallel``
    block. The run's layout (step 1's) says the ranks are DP replicas: step 0's scalars are
    joined (the global batch's tokens, the replicas' hashes marked as joined), not rank 0's --
    which made a one-process run of the same global batch fail as `data` at step 0."""
    for rank in range(2):
        layered = _rank(rank, _rows(rank), tokens=6, hash_=("ab"[rank]) * 64).trace
        scalars = {1: StepScalars(1, loss=1.0, lr=(0.1,), tokens=6, batch_hash=("cd"[rank]) * 64)}
        step1 = {**layered.manifest, "step": 1, "scalars": scalars_manifest(scalars)}
        records = tuple(replace(r, step=1, tensor_key=None) for r in layered.records)  # stats
        write_trace(Trace(step1, records, {}, read_run_record(step1)), tmp_path / "step1" / f"rank{rank}")
        alone = {0: StepScalars(0, loss=1.0 + rank, lr=(0.1,), tokens=6, batch_hash=("ef"[rank]) * 64)}
        step0 = {"step": 0, "record_mode": "scalars", "scalars": scalars_manifest(alone)}
        write_trace(Trace(step0, (), {}, read_run_record(step0)), tmp_path / "step0" / f"rank{rank}")
    merged = load_parallel_side(tmp_path)
    assert merged is not None
    first = scalars_of(merged.manifest)[0]
    assert first.batch_hash is not None and first.batch_hash.startswith(JOINED_HASH)
    assert first.tokens == 12 and first.loss == 1.5


def test_the_replicas_rows_hashes_add_up_to_the_global_batchs_and_copies_must_agree_on_them() -> None:
    def side(batch: str, rows: int | None) -> dict[int, StepScalars]:
        held = None if rows is None else f"{rows:064x}"
        return {0: StepScalars(step=0, loss=1.0, tokens=4, batch_hash=batch * 64, rows_hash=held)}

    top = (1 << 256) - 1
    joined, findings = join_scalars([("rank0", side("a", 3)), ("rank1", side("b", top))], joined=True)
    assert joined is not None and not findings
    assert joined[0].rows_hash == f"{2:064x}"  # summed modulo 2**256
    lacking, _ = join_scalars([("rank0", side("a", 3)), ("rank1", side("b", None))], joined=True)
    assert lacking is not None and lacking[0].rows_hash is None  # one replica's rows unknown: unknown
    _, findings = join_scalars([("rank0", side("a", 3)), ("rank1", side("a", 4))], joined=False)
    assert [f.name for f in findings] == ["step scalar rows_hash"]
