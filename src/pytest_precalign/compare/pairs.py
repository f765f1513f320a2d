"""Compare two traces record by record under a tolerance table.

Pairs are made by record id (name, kind, slot, step, call) after the candidate was brought
to the baseline's names (``mapping``). Each pair is checked with the best evidence both
sides have: full tensors (allclose + metric bounds), statistics (each of max/min/mean/norm
within atol + rtol*|baseline|), or hashes (equality). Shape mismatches and unmatched
records are findings, never exceptions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..trace.merged_stats import merged_name
from ..trace.records import Record, Trace
from ..trace.tensor_files import bf16_to_float32
from ..vocabulary import CHECKED, Evidence, Status
from . import forked_jobs, fused_pass, metrics
from .tolerances import BOUND_METRICS, Tolerance, ToleranceTable

_PRECISION = ["float64", "float32", "bfloat16", "float16"]  # lookup uses the less precise side


def severity(value: float, allowed: float, upper: bool, passed: bool) -> float:
    """How much of its allowance a check uses: 0 = perfect, 1.0 = at the bound, > 1 past it.

    * Upper bounds (``value <= allowed``: differences, errors): ``value / allowed``; with
      ``allowed == 0`` (hashes, NaN/Inf counts), 0 when the value is 0, else inf.
    * Lower bounds (``value >= allowed``: cosine, fractions within; bounds in [0, 1], 1 is
      perfect): the shortfall from 1 over the allowed shortfall, ``(1 - value) / (1 - allowed)``,
      so that cosine 0.9999 against 0.999 uses 10% of its allowance (``allowed / value`` would say
      99.9%); a value rounding above 1 counts as 0. With ``allowed == 1``, 0 when the value
      reaches 1, else inf.
    * A NaN value (no comparison holds) is inf when the check failed, 0 when it passed.

    The shape check is not a bound: its numbers are element counts (candidate, baseline), so
    its ratio says nothing; it keeps that ratio (report.json's ``severity`` has always carried
    it), and the check explains its record by failing, not by its severity.

    Pure, so that the report chart applies the same rule to report.json's checks."""
    if upper and allowed > 0:
        ratio = value / allowed
    elif upper:
        ratio = 0.0 if value == 0 else math.inf
    elif allowed < 1:
        ratio = (1 - value) / (1 - allowed)
        ratio = 0.0 if ratio < 0 else ratio  # not max(): it would drop a NaN
    else:
        ratio = 0.0 if value >= 1 else math.inf
    if math.isnan(ratio):
        return 0.0 if passed else math.inf
    return ratio


@dataclass(frozen=True)
class Check:
    metric: str
    value: float
    allowed: float
    passed: bool
    upper: bool = True  # value must be <= allowed (False: >=)

    @property
    def severity(self) -> float:
        """See ``severity``."""
        return severity(self.value, self.allowed, self.upper, self.passed)


def explaining_check(checks: Sequence[Check]) -> Check | None:
    """The check that explains a record: the first failing one (allclose comes before the
    metric bounds), else the tightest by ``severity``; None without checks."""
    for check in checks:
        if not check.passed:
            return check
    return max(checks, key=lambda c: c.severity, default=None)


@dataclass(frozen=True)
class PairResult:
    record: Record  # the baseline record (or the candidate's, when only it exists)
    candidate: Record | None
    status: Status
    evidence: Evidence
    checks: tuple[Check, ...] = ()
    tolerance: Tolerance | None = None
    closeness: metrics.Closeness | None = None
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "ok"

    @property
    def paired(self) -> bool:
        return self.status in CHECKED

    @property
    def failing(self) -> Check | None:
        """The check that explains the failure: allclose first, then the worst bound."""
        check = self.explaining_check
        return check if check is not None and not check.passed else None

    @property
    def explaining_check(self) -> Check | None:
        """The check a reader should see for this record: the failing one, else the tightest."""
        return explaining_check(self.checks)

    @property
    def severity(self) -> float:
        """The record's worst ``Check.severity`` (0 without checks)."""
        return max((c.severity for c in self.checks), default=0.0)


@dataclass(frozen=True)
class Comparison:
    pairs: tuple[PairResult, ...]  # in baseline execution order, candidate-only ones last

    def by_phase(self, phase: str) -> tuple[PairResult, ...]:
        return tuple(p for p in self.pairs if p.record.phase == phase)


def lookup_dtype(a: str, b: str) -> str:
    ranks = [_PRECISION.index(d) if d in _PRECISION else -1 for d in (a, b)]
    return a if ranks[0] >= ranks[1] else b


def compare_traces(
    baseline: Trace,
    candidate: Trace,
    table: ToleranceTable,
    reasons: Mapping[str, str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 1,
) -> Comparison:
    """``reasons``: why a record is known to have no counterpart (from the mapping);
    ``progress(done, total)`` is called as records are compared (a CLI progress bar).
    ``workers``: threads comparing tensor pairs (the caller decides how many).

    Tensor pairs are compared on worker threads (numpy releases the GIL while it
    subtracts), each loading its pair only when it starts, so memory holds a few pairs at a
    time however large the traces are."""
    reasons = reasons or {}
    cand_by_id = candidate.by_id()
    used: set[str] = set()
    out: list[PairResult] = []
    # Records sharing a tensor (a layout-mapped copy, an msprobe data_name) share one compare.
    jobs: dict[tuple[str | None, str | None, Tolerance], tuple[Record, Record]] = {}
    pending: dict[int, tuple[tuple[str | None, str | None, Tolerance], PairResult]] = {}
    for rec in baseline.records:
        other = cand_by_id.get(rec.id)
        if other is None:
            out.append(PairResult(rec, None, "only_baseline", "none", note=reasons.get(rec.id, "")))
            continue
        used.add(rec.id)
        result = _compare_pair(rec, other, baseline, candidate, table)
        if result.evidence == "tensor" and result.tolerance is not None:  # checks come below
            key = (rec.tensor_key, other.tensor_key, result.tolerance)
            jobs.setdefault(key, (rec, other))
            pending[len(out)] = (key, result)
        out.append(result)
    for rec in candidate.records:
        if rec.id not in used:
            out.append(PairResult(rec, rec, "only_candidate", "none", note=reasons.get(rec.id, "")))
    done = _run_tensor_jobs(jobs, baseline, candidate, len(baseline.records) - len(jobs), progress, workers)
    for i, (key, result) in pending.items():
        hit = done[key]
        out[i] = replace(result, status=hit.status, checks=hit.checks, closeness=hit.closeness)
    return Comparison(tuple(out))


def _run_tensor_jobs(
    jobs: Mapping[tuple[str | None, str | None, Tolerance], tuple[Record, Record]],
    ta: Trace,
    tb: Trace,
    already: int,
    progress: Callable[[int, int], None] | None,
    workers: int,
) -> dict[tuple[str | None, str | None, Tolerance], PairResult]:
    total = already + len(jobs)
    if progress is not None:
        progress(already, total)

    def run(key: tuple[str | None, str | None, Tolerance]) -> PairResult:
        a, b = jobs[key]
        (xa, raw_a), (xb, raw_b) = ta.raw_array(a), tb.raw_array(b)
        return _tensor_pair(a, b, xa, xb, key[2], (raw_a, raw_b))

    results: dict[tuple[str | None, str | None, Tolerance], PairResult] = {}
    if workers == 1 or len(jobs) < 2:
        for n, key in enumerate(jobs, 1):
            results[key] = run(key)
            if progress is not None:
                progress(already + n, total)
        return results
    if forked_jobs.fork_usable():
        return _run_forked(jobs, run, already, progress, workers)
    from concurrent.futures import ThreadPoolExecutor, as_completed

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="precalign-compare") as pool:
        futures = {pool.submit(run, key): key for key in jobs}
        for n, future in enumerate(as_completed(futures), 1):
            results[futures[future]] = future.result()
            if progress is not None:
                progress(already + n, total)
    return results


def _run_forked(
    jobs: Mapping[tuple[str | None, str | None, Tolerance], tuple[Record, Record]],
    run: Callable[[tuple[str | None, str | None, Tolerance]], PairResult],
    already: int,
    progress: Callable[[int, int], None] | None,
    workers: int,
) -> dict[tuple[str | None, str | None, Tolerance], PairResult]:
    """The pairs shared with forked processes (``forked_jobs``), largest first; a child sends
    back only what it measured (status, checks, closeness), not the records."""
    keys = list(jobs)
    order = sorted(range(len(keys)), key=lambda i: -jobs[keys[i]][0].numel)
    counted = [already]

    def measured(i: int) -> tuple[Status, tuple[Check, ...], metrics.Closeness | None]:
        hit = run(keys[i])
        return hit.status, hit.checks, hit.closeness

    def done(_: int) -> None:
        counted[0] += 1
        if progress is not None:
            progress(counted[0], already + len(keys))

    found = forked_jobs.run_forked(order, measured, min(workers, len(keys)), done)
    out = {}
    for i, key in enumerate(keys):
        a, b = jobs[key]
        status, checks, closeness = found[i]
        out[key] = PairResult(a, b, status, "tensor", checks, key[2], closeness)
    return out


def _compare_pair(a: Record, b: Record, ta: Trace, tb: Trace, table: ToleranceTable) -> PairResult:
    """The pair's result, or for two kept tensors a tensor result without checks yet."""
    tol = table.lookup(a.name, a.kind, a.phase, lookup_dtype(a.dtype, b.dtype), a.step)
    if a.shape != b.shape and not same_elements(a.shape, b.shape):
        note = f"shape {list(b.shape)} (candidate) != {list(a.shape)} (baseline)"
        check = Check("shape", float(b.numel), float(a.numel), False)
        return PairResult(a, b, "shape", "none", (check,), tol, note=note)
    notes = (
        f"shape {list(b.shape)} (candidate) vs {list(a.shape)} (baseline): the same elements in the same "
        "order (they differ only in dimensions of size 1)"
        if a.shape != b.shape
        else "",
        f"dtype {b.dtype} (candidate) vs {a.dtype} (baseline)" if a.dtype != b.dtype else "",
    )
    note = "; ".join(n for n in notes if n)
    if ta.has_tensor(a) and tb.has_tensor(b):
        return PairResult(a, b, "ok", "tensor", (), tol, None, note)
    same_hash = a.crc32 is not None and b.crc32 is not None and hash_kind(a.crc32) == hash_kind(b.crc32)
    if same_hash and _hash_first(ta) and _hash_first(tb):
        # Both sides were dumped for bit equality (md5/xor summaries): compare the hashes even
        # where statistics came along.
        return _hash_pair(a, b, tol, note)
    if a.stats is not None and b.stats is not None:
        checks = _stats_checks(a, b, tol)
        status: Status = "ok" if all(c.passed for c in checks) else "fail"
        if a.merged or b.merged:
            note = "; ".join(n for n in (merged_note(a, b), note) if n)
            return PairResult(a, b, status, "merged_stats", checks, tol, None, note)
        return PairResult(a, b, status, "stats", checks, tol, None, note)
    if same_hash:
        return _hash_pair(a, b, tol, note)
    kinds = f"{evidence_kind(a, ta)} vs {evidence_kind(b, tb)}"
    return PairResult(a, b, "not_compared", "none", (), tol, None, f"cannot be compared ({kinds})")


def same_elements(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two shapes that hold the same elements in the same order: equal once their dimensions of
    size 1 are dropped (``[4, 8]`` and ``[1, 4, 8]``: a release that keeps a batch dimension of 1
    where another squeezed it). A difference in how they broadcast shows downstream."""
    return [d for d in a if d != 1] == [d for d in b if d != 1]


def _hash_pair(a: Record, b: Record, tol: Tolerance, note: str) -> PairResult:
    assert a.crc32 is not None and b.crc32 is not None
    same = a.crc32 == b.crc32
    check = Check("crc32", 0.0 if same else 1.0, 0.0, same)
    return PairResult(a, b, "ok" if same else "fail", "hash", (check,), tol, None, note)


def hash_kind(value: str) -> str:
    """What a record's checksum is: msprobe's xor summary and md5 are kept apart from a CRC-32
    (ours, and msprobe's 8-digit "md5") by their prefix (``msprobe.reader``)."""
    if value.startswith("xor:"):
        return "xor checksum"
    if value.startswith("md5:"):
        return "md5 checksum"
    return "CRC-32 checksum"


def evidence_kind(rec: Record, trace: Trace) -> str:
    """One side's evidence in words: the tensor's values, statistics (merged from several
    records), a checksum, or nothing."""
    if trace.has_tensor(rec):
        return "tensor values"
    if rec.crc32 is not None and (rec.stats is None or _hash_first(trace)):
        return hash_kind(rec.crc32)
    if rec.stats is not None:
        return "merged statistics" if rec.merged else "statistics"
    return "nothing recorded"


def merged_note(a: Record, b: Record) -> str:
    """What a pair of merged statistics compared, e.g. ``merged statistics of
    model.layers.0.self_attn.{q_proj,k_proj,v_proj} (baseline) against one fused tensor
    (candidate)``, and that the evidence is statistical."""
    sides = [
        f"{merged_name(rec.merged)} ({side})" if rec.merged else f"one fused tensor ({side})"
        for side, rec in (("baseline", a), ("candidate", b))
    ]
    return (
        f"merged statistics of {sides[0]} against {sides[1]}: statistical evidence (max of maxes, "
        "min of mins, element-weighted mean, root of summed squared norms), not element-wise"
    )


def array_pair(a: Record, b: Record, xa: Any, xb: Any, tol: Tolerance) -> PairResult:
    """Two arrays of records ``a`` (baseline) and ``b`` compared under ``tol``, as a tensor pair
    is (e.g. one DP replica's rows of a joined record: ``verdict.dp_rows``)."""
    return _tensor_pair(a, b, xa, xb, tol)


def stats_pair(a: Record, b: Record, tol: Tolerance) -> PairResult:
    """Two records' statistics compared under ``tol``, as a statistics pair is."""
    checks = _stats_checks(a, b, tol)
    return PairResult(a, b, "ok" if all(c.passed for c in checks) else "fail", "stats", checks, tol)


def _tensor_pair(
    a: Record, b: Record, xa: Any, xb: Any, tol: Tolerance, raw: tuple[bool, bool] = (False, False)
) -> PairResult:
    """``raw``: which side is bfloat16 as its uint16 bits (``Trace.raw_array``): widened a
    chunk at a time by the fused pass when the pair is compared in float32."""
    dtype = metrics.compute_dtype(xa, xb)
    if xb.shape != xa.shape:  # the same elements (``same_elements``): laid out as the baseline's
        xb = xb.reshape(xa.shape)
    if any(raw) and dtype != np.float32:  # float64 on the other side: widen up front
        xa, xb = (bf16_to_float32(x) if r else x for x, r in zip((xa, xb), raw, strict=True))
        raw = (False, False)
    fa, fb = (
        x.reshape(-1) if r else metrics.as_compute(x, dtype) for x, r in zip((xa, xb), raw, strict=True)
    )
    names = tuple(name for name, _ in tol.bounds)
    # One pass over the pair for the allclose view and the bounds' metrics (a second one only
    # when the pair is not aligned): fused_pass.
    found = fused_pass.measure_pair(fa, fb, tol.atol, tol.rtol, names, tuple(xa.shape), dtype, raw)
    checks: list[Check] = []
    close = found.closeness
    if close is not None:
        if close.nonfinite_mismatch:
            checks.append(Check("nonfinite", float(close.nonfinite_mismatch), 0.0, False))
        passed = close.mismatched == 0
        checks.append(Check("allclose", close.worst_abs, close.worst_allowed, passed))
    summary = found.summary
    if summary is not None:
        # Without the allclose check, the metrics' pass finds the NaN/Inf that differ: they fail
        # the record whatever the bounds (the metrics count only elements finite on both sides).
        if close is None and summary.nonfinite_mismatch:
            checks.append(Check("nonfinite", float(summary.nonfinite_mismatch), 0.0, False))
        for name, bound in tol.bounds:
            value = summary.values[name]
            upper = BOUND_METRICS[name]
            ok = summary.comparable and (value <= bound if upper else value >= bound)
            checks.append(Check(name, value, bound, ok, upper))
    shared = close.nonfinite_shared if close is not None else summary.nonfinite_shared if summary else 0
    if shared:  # first: it explains the record when the rule does not accept it
        checks.insert(0, shared_nonfinite(shared, tol))
    status: Status = "ok" if all(c.passed for c in checks) else "fail"
    return PairResult(a, b, status, "tensor", tuple(checks), tol, close)


def _stats_checks(a: Record, b: Record, tol: Tolerance) -> tuple[Check, ...]:
    assert a.stats is not None and b.stats is not None
    checks = []
    if (a.stats.nan, a.stats.inf) != (b.stats.nan, b.stats.inf):
        mismatch = abs(a.stats.nan - b.stats.nan) + abs(a.stats.inf - b.stats.inf)
        checks.append(Check("nonfinite", float(mismatch), 0.0, False))
    elif a.stats.nan or a.stats.inf:  # as many NaN/Inf on each side: as far as statistics tell
        checks.append(shared_nonfinite(a.stats.nan + a.stats.inf, tol))
    inf = float("inf")
    if tol.atol == inf and (tol.rule is None or tol.rule.atol is None):
        # A rule of metric bounds only (cosine, ...), which statistics cannot evaluate: they
        # are held to a 1e-3 relative error instead.
        atol, rtol = 0.0, 1e-3
    else:
        # An explicit ``atol: .inf`` (or ``rtol: .inf``) bounds no difference, as in tensor mode.
        atol, rtol = tol.atol, tol.rtol
    sa: Mapping[str, float] = {
        "max": a.stats.max,
        "min": a.stats.min,
        "mean": a.stats.mean,
        "norm": a.stats.norm,
    }
    sb: Mapping[str, float] = {
        "max": b.stats.max,
        "min": b.stats.min,
        "mean": b.stats.mean,
        "norm": b.stats.norm,
    }
    for key, va in sa.items():
        vb = sb[key]
        allowed = _allowed(atol, rtol, abs(va))
        if not (_finite(va) and _finite(vb)):
            # NaN/Inf on one side only, or different ones: a mismatch whatever the tolerance.
            if not (va == vb or (va != va and vb != vb)):
                checks.append(Check(f"stats.{key}", math.inf, allowed, False))
            continue
        if key == "norm":
            # The norm sums over all elements: allow atol per element, in L2.
            allowed = _allowed(atol * max(a.numel, 1) ** 0.5, rtol, abs(va))
        diff = abs(vb - va)
        checks.append(Check(f"stats.{key}", diff, allowed, diff <= allowed))
    return tuple(checks)


SHARED_NONFINITE = "nonfinite_shared"


def shared_nonfinite(count: int, tol: Tolerance) -> Check:
    """The same NaN/Inf on both sides (``count`` elements): a failure, as with
    torch.testing.assert_close's default ``equal_nan=False`` -- two runs broken alike are not
    aligned -- unless the rule says ``equal_nan: true`` (then it passes, and the report says so)."""
    return Check(SHARED_NONFINITE, float(count), math.inf if tol.equal_nan else 0.0, tol.equal_nan)


def broken_alike(pair: PairResult) -> bool:
    """The pair fails only for the same NaN/Inf on both sides: both runs broke alike there; no
    difference between them (the NaN policy fails it; a run's divergence is elsewhere)."""
    bad = [c for c in pair.checks if not c.passed]
    return bool(bad) and all(c.metric == SHARED_NONFINITE for c in bad)


def _allowed(atol: float, rtol: float, size: float) -> float:
    """atol + rtol * size, where an infinite tolerance allows anything (even at size 0)."""
    if math.inf in (atol, rtol):
        return math.inf
    return atol + rtol * size


def _hash_first(trace: Trace) -> bool:
    """Recorded for bit equality: our hash mode, or msprobe's md5/xor summary modes."""
    return trace.mode == "hash" or trace.manifest.get("summary_mode") in ("md5", "xor")


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")
