"""The TP rank named from each rank's partial sum of a row-parallel module before its
all-reduce (``verdict/tp_ranks.py``); end to end under torchrun in
``tests/training/test_dp_runs.py`` (slow)."""

from __future__ import annotations

from pytest_precalign.reports.training_evidence_text import evidence_text, rank_note_text
from pytest_precalign.trace.note_blocks import TpPartials
from pytest_precalign.verdict.run_evidence import GradsScaled
from pytest_precalign.verdict.tp_ranks import partial_sums

SUMS = {"0": [[0.5, -0.4, 0.02, 1.0]], "1": [[0.25, -0.3, 0.04, 0.8]]}
ORIGIN = "model.layers.1.mlp.down_proj"


def test_the_rank_whose_partial_sum_differs_is_named() -> None:
    doubled = {"0": SUMS["0"], "1": [[v * 2 for v in SUMS["1"][0]]]}
    said = rank_note_text(partial_sums(SUMS, doubled, ORIGIN))
    assert said.startswith(f"TP rank1: its partial sum of {ORIGIN} before the all-reduce differs")
    assert "rank0" not in said


def test_rounding_is_not_a_rank_and_agreeing_shares_say_the_reduction_differs() -> None:
    rounded = {r: [[v * (1 + 1e-6) for v in calls[0]]] for r, calls in SUMS.items()}
    said = rank_note_text(partial_sums(SUMS, rounded, ORIGIN))
    assert "the shares agree, their reduction differs" in said


def test_without_the_same_layout_the_rank_cannot_be_told() -> None:
    for base, cand in (
        (None, SUMS),
        (SUMS, None),
        ({"0": SUMS["0"]}, SUMS),
        ({"0": [None], "1": [None]}, SUMS),
    ):
        assert "cannot be told" in rank_note_text(partial_sums(base, cand, ORIGIN))


def test_a_backward_divergence_names_the_rank_whose_local_grad_shard_differs() -> None:
    """Where a run first diverges in the backward at a module whose sharded weights' grads each
    rank kept as its local shard (the ``tp_grad_shards`` note), the rank is named (on main
    before this: a backward fault was never traced to its rank); against a side without them,
    one line why not."""
    from pytest_precalign.trace.records import Trace
    from pytest_precalign.verdict.tp_ranks import with_tp_rank
    from pytest_precalign.verdict.training_run import FirstDivergent, TrainingVerdict

    param = f"{ORIGIN}.weight"
    doubled = {"0": SUMS["0"], "1": [[v * 2 for v in SUMS["1"][0]]]}

    def side(kept: dict[str, object] | None) -> Trace:
        trace = Trace(manifest={}, records=())
        shards = TpPartials.from_json({param: kept}, "test", "tp_grad_shards") if kept else None
        return trace.with_notes(tp_grad_shards={"1": shards}) if shards else trace

    first = FirstDivergent(step=1, what="backward", origin=ORIGIN, evidence=GradsScaled(1, 4, 2.0))
    training = TrainingVerdict(steps_compared=2, lane="approximate", first=first)
    named = with_tp_rank(training, side(SUMS), side(doubled))
    assert named is not None and named.first is not None
    assert evidence_text(named.first.evidence) == (
        f"all 4 parameter grads of step 1 differ by the factor 2; TP rank1: its local shard of {param}'s grad differs from the other side's "
        "same rank's (max, min, sum or norm beyond 0.001 relative); the other ranks' match"
    )
    told = with_tp_rank(training, side(None), side(doubled))
    assert told is not None and told.first is not None
    assert f"which TP rank's shard of {param}'s grad differs cannot be told" in evidence_text(
        told.first.evidence
    )
    assert with_tp_rank(training, side(None), side(None)) == training  # nothing kept: nothing said
