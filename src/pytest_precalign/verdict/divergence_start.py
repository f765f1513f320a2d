"""Where the sides start to differ, before the first failing record is called a divergence:
a gradient moves to the consumer input whose own backward made the difference, a failure moves
to an earlier record that ran in a lower precision on one side; and whether a record's
dependencies vouch for it (compared, same floating dtype, within tolerance)."""

from __future__ import annotations

from collections.abc import Mapping

from ..compare.pairs import PairResult, lookup_dtype
from ..trace.records import Record
from ..vocabulary import FAILED
from .non_data_inputs import set_aside
from .origin_facts import LowerPrecisionFirst, RecordChoice


def divergent_pair(
    pair: PairResult,
    pairs: tuple[PairResult, ...],
    all_pairs: Mapping[str, PairResult],
    kinds: tuple[str, ...],
) -> tuple[PairResult, RecordChoice | None]:
    """The first failing record, moved to where the sides start to differ: a gradient to the
    input that consumes it, a failure to an earlier lower-precision record; with why it moved
    there (None: it is the first failing record, or its consumer input)."""
    if pair.record.kind == "grad_output":
        pair = consumer_grad_input(pair, pairs, all_pairs) or pair
    lower = lower_precision_before(pair, pairs, kinds)
    if lower is None or _one_rule(lower, pair):
        return pair, None
    # The first failure is held to its own dtype's tolerance, but an earlier record ran in a
    # lower precision on one side and passed only under that looser tolerance: that record
    # is where the sides start to compute differently.
    other = lower.candidate
    assert other is not None
    tolerance = lookup_dtype(lower.record.dtype, other.dtype)
    return lower, LowerPrecisionFirst(
        other.dtype, lower.record.dtype, tolerance, pair.record.name, pair.record.dtype
    )


def _one_rule(lower: PairResult, pair: PairResult) -> bool:
    """Both judged by one rule of the table (a mixed-precision table's, say): the earlier
    record passed under the same bounds as the failure, not under a looser dtype default."""
    a, b = lower.tolerance, pair.tolerance
    return a is not None and b is not None and a.rule is not None and a.rule == b.rule


def consumer_grad_input(
    pair: PairResult, pairs: tuple[PairResult, ...], all_pairs: Mapping[str, PairResult]
) -> PairResult | None:
    """The grad w.r.t. a module's output is the grad w.r.t. its consumers' inputs: one
    tensor, recorded first as the producer's grad_output (its hook was registered first) and
    right after as each consumer's grad_input. When a consumer's grad_outputs matched, its
    own backward made the difference: that grad_input is the divergence, and its origin."""
    a = pair.record
    later = sorted(
        (p for p in pairs if p.record.step == a.step and p.record.seq > a.seq), key=lambda p: p.record.seq
    )
    for p in later:
        b = p.record
        if not same_tensor(a, b):
            break
        if b.kind == "grad_input" and p.status in FAILED and deps_ok(b, all_pairs):
            return p
    return None


def floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def lower_precision_before(
    first: PairResult, pairs: tuple[PairResult, ...], kinds: tuple[str, ...]
) -> PairResult | None:
    """The earliest passing output of the same step computed in another floating dtype on each
    side, when ``first`` itself has one dtype on both sides (else the whole run is in mixed
    precision, and its tolerance already says so). Layers are matched with layers, API calls
    with API calls."""
    if first.candidate is None or first.candidate.dtype != first.record.dtype:
        return None
    rec = first.record
    for p in sorted(pairs, key=lambda p: p.record.seq):
        if p.record.seq >= rec.seq:
            break
        other = p.candidate
        if (
            p.status == "ok"
            and p.record.step == rec.step
            and (p.record.module_class == "api") == (rec.module_class == "api")
            and p.record.kind in kinds
            and other is not None
            and other.dtype != p.record.dtype
            and floating(other.dtype)
            and floating(p.record.dtype)
        ):
            return p
    return None


def same_tensor(a: Record, b: Record) -> bool:
    """Two records of one tensor object (the recorder stores it once and reuses what it saw)."""
    if a.tensor_key is not None or b.tensor_key is not None:
        return a.tensor_key == b.tensor_key
    if a.stats is None and a.crc32 is None:
        return False
    return a.shape == b.shape and (a.stats is b.stats or a.stats == b.stats) and a.crc32 == b.crc32


def deps_ok(rec: Record, all_pairs: Mapping[str, PairResult]) -> bool | None:
    """True/False when every dependency was compared; None when some were not recorded.
    A mask, position or cache input whose form changed between the sides is set aside."""
    results = [all_pairs.get(d) for d in rec.deps]
    known = [r for r in results if r is not None and comparable(r) and not set_aside(r)]
    if not known:
        return None
    return all(r.passed for r in known)


def comparable(pair: PairResult) -> bool:
    """A dependency that can vouch for its consumer: same dtype, floating point."""
    other = pair.candidate
    return (
        pair.paired
        and other is not None
        and pair.record.dtype == other.dtype
        and pair.record.dtype.startswith(("float", "bfloat", "complex"))
    )
