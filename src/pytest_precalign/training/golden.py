"""Live compare with a golden run: which records keep their full tensor.

``Recorder(..., golden=PATH)`` (and ``record: {golden: PATH}`` in a case) compares each record,
while recording, against the golden run's record with the same id (name, kind, slot, step,
call) by the existing pair check (``compare.pairs``): statistics under the tolerance table,
hashes exactly. ``GoldenJudge.verdict`` says why a record may need its full tensor: it is
beyond tolerance (which includes non-finite where the golden is finite), has no golden
counterpart, or has another shape than the golden's (another model). The recorder keeps it,
with the inputs of its module, where the divergence enters (``recording/live_golden.py``),
so the origin can be proven from the trace.

Fail closed: records without a golden counterpart keep their tensors and are listed in the
manifest's ``"live"`` key, as are shape mismatches; a golden PATH that is missing or
unreadable is one ``GoldenError`` naming it. No torch import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compare.pairs import compare_traces
from ..compare.tolerances import ToleranceTable, load_table
from ..errors import ConfigError, TraceError
from ..parallel.stored import load_rank
from ..trace.records import Record, Trace


class GoldenError(ConfigError, TraceError):
    """A golden run that cannot be used: missing, unreadable, no record for this step/rank
    (an argument error of the Python API, so a ``ConfigError``)."""


def load_golden(path: str | Path, step: int, rank: int) -> Trace:
    """The golden trace for ``step`` on ``rank`` (``parallel.stored.load_rank``: a trace
    folder, a ``Recorder`` root or an msprobe dump); ``GoldenError`` naming it otherwise."""
    try:
        return load_rank(path, step, rank)
    except TraceError as exc:
        raise GoldenError(f"golden {exc}") from None


@dataclass
class GoldenJudge:
    """Compares records against one golden trace and counts what happened (see module doc)."""

    source: str
    golden: Trace
    table: ToleranceTable
    compared: int = 0
    beyond: list[str] = field(default_factory=list)
    no_golden: list[str] = field(default_factory=list)
    shape_mismatch: list[str] = field(default_factory=list)
    _by_id: dict[str, Record] = field(default_factory=dict)
    _seen: int = 0

    def __post_init__(self) -> None:
        self._by_id = self.golden.by_id()
        # Only the golden record itself is compared: its tensor (if any) is not read.
        self._golden_view = self.golden.with_records((), {})
        self._live_view = Trace({"record_mode": "stats"}, (), {})

    def wants_crc(self, record_id: str) -> bool:
        """Whether the record needs a CRC-32 to be compared (the golden has only a hash)."""
        g = self._by_id.get(record_id)
        return g is not None and g.crc32 is not None

    def verdict(self, record: Record) -> str | None:
        """None when ``record`` (with its statistics / CRC) is within tolerance of the golden;
        else ``"beyond"``, ``"no_golden"`` or ``"shape"``."""
        self._seen += 1
        g = self._by_id.get(record.id)
        if g is None:
            self.no_golden.append(record.id)
            return "no_golden"
        self.compared += 1
        base = self._golden_view.with_records((g,), {})
        cand = Trace(self._live_view.manifest, (record,), {})
        pair = compare_traces(base, cand, self.table).pairs[0]
        if pair.status == "shape":
            self.shape_mismatch.append(record.id)
            return "shape"
        if pair.evidence == "none":
            # Nothing to compare with (e.g. golden hash, no CRC here): fail closed, keep it.
            self.no_golden.append(record.id)
            return "no_golden"
        if not pair.passed:
            self.beyond.append(record.id)
            return "beyond"
        return None

    def summary(self, kept_tensors: int, kept_bytes: int, downstream: int) -> dict[str, Any]:
        """The manifest's ``"live"`` key (``downstream``: beyond records kept as statistics
        only, their inputs being beyond already)."""
        out: dict[str, Any] = {
            "golden": self.source,
            "table": self.table.name,
            "records": self._seen,
            "compared": self.compared,
            "beyond": list(self.beyond),
            "downstream": downstream,
            "kept_tensors": kept_tensors,
            "kept_bytes": kept_bytes,
        }
        if self.no_golden:
            out["no_golden"] = list(self.no_golden)
        if self.shape_mismatch:
            out["shape_mismatch"] = list(self.shape_mismatch)
        if self._seen and len(self.no_golden) * 2 > self._seen:
            out["warning"] = (
                f"{len(self.no_golden)} of {self._seen} records have no golden counterpart in "
                f"{self.source}: is it a run of this model (same names, step, rank)?"
            )
        return out


def golden_judge(
    path: str | Path, step: int, rank: int, tolerances: str | Path | ToleranceTable | None = None
) -> GoldenJudge:
    """The judge for one recorded step on one rank (see ``load_golden``)."""
    return GoldenJudge(
        str(path), load_golden(path, step, rank), load_table(tolerances, "Recorder: tolerances")
    )
