"""``compare_result.csv`` next to report.json: one row per record pair in msprobe's column
names (candidate = "NPU", baseline = "Bench"), so a spreadsheet filter written for msprobe's
``compare_result_*.csv`` works on it, then our own columns (allowed, rule, origin, ...).

The header follows msprobe's compare mode of the strongest evidence in the document: tensor
(Cosine, EucDist, MaxAbsErr, ...), statistics (Max diff, ..., NormRelativeErr) or md5.
Metrics a tolerance table did not ask for are "N/A", as msprobe writes what it did not compute.
Written from the report.json document (under xdist: the controller's merged one).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

CSV_FILE = "compare_result.csv"
NA = "N/A"
BASIC = [
    "NPU Name",
    "Bench Name",
    "NPU Dtype",
    "Bench Dtype",
    "NPU Tensor Shape",
    "Bench Tensor Shape",
    "NPU Requires_grad",
    "Bench Requires_grad",
]
SUMMARY = [
    "NPU max",
    "NPU min",
    "NPU mean",
    "NPU l2norm",
    "Bench max",
    "Bench min",
    "Bench mean",
    "Bench l2norm",
]
# our metric -> msprobe's column (tensor mode)
TENSOR_METRICS = {
    "cosine": "Cosine",
    "euclidean": "EucDist",
    "max_abs": "MaxAbsErr",
    "max_rel": "MaxRelativeErr",
    "one_thousandth": "One Thousandth Err Ratio",
    "five_thousandth": "Five Thousandths Err Ratio",
}
STAT_DIFFS = ["Max diff", "Min diff", "Mean diff", "L2norm diff"]
STAT_RELATIVE = ["MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr"]
MODE_COLUMNS = {
    "tensor": list(TENSOR_METRICS.values()),
    "stats": STAT_DIFFS + STAT_RELATIVE,
    "hash": ["NPU MD5", "BENCH MD5"],
}
RESULT = ["Requires_grad Consistent", "Result", "Err_message"]
OURS = [
    "Accuracy Reached or Not",
    "case",
    "phase",
    "kind",
    "slot",
    "step",
    "status",
    "metric",
    "value",
    "allowed",
    "rule",
    "origin",
]


def csv_mode(entries: Sequence[Mapping[str, Any]]) -> str:
    """msprobe's compare mode for the document: the strongest evidence any record has."""
    seen = {r.get("evidence") for e in entries for r in e.get("records", [])}
    seen |= {"stats"} if "merged_stats" in seen else set()
    return next((m for m in ("tensor", "stats", "hash") if m in seen), "tensor")


def msprobe_header(mode: str) -> list[str]:
    """msprobe's own header for the mode (mindstudio-probe 26.2's compare_result_*.csv)."""
    middle = MODE_COLUMNS[mode] + (SUMMARY if mode != "hash" else [])
    return BASIC + middle + RESULT + (["Data_name"] if mode == "tensor" else [])


def header(mode: str) -> list[str]:
    return msprobe_header(mode) + OURS


def compare_csv_text(document: Mapping[str, Any]) -> str:
    """``compare_result.csv``'s text, from the report.json document."""
    entries: Sequence[Mapping[str, Any]] = document.get("cases", [])
    mode = csv_mode(entries)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header(mode))
    for entry in entries:
        writer.writerows([inert(cell) for cell in row] for row in _rows(entry, mode))
    return out.getvalue()


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def inert(cell: str) -> str:
    """A cell a spreadsheet will not run as a formula (OWASP's CSV injection advice): text that
    starts with ``= + - @``, a tab or a CR gets a leading single quote; numbers ("-1.5e-3",
    "-inf") stay numbers."""
    if not cell.startswith(_FORMULA_START):
        return cell
    try:
        float(cell)
    except ValueError:
        return "'" + cell
    return cell


def _rows(entry: Mapping[str, Any], mode: str) -> Iterator[list[str]]:
    for record in entry.get("records", []):
        yield _record_row(entry, record, mode)
    unmatched = entry.get("unmatched") or {}
    for side in ("baseline", "candidate"):
        for u in unmatched.get(side, []):
            yield _unmatched_row(entry, u, side, mode)


def _text(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def _num(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return math.nan


def _shape(shape: Any) -> str:
    return NA if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def _middle(record: Mapping[str, Any], mode: str) -> list[str]:
    checks = {c.get("metric"): c.get("value") for c in record.get("checks", [])}
    stats = record.get("stats") or {}
    npu, bench = stats.get("candidate"), stats.get("baseline")
    if mode == "tensor":
        cells = [_text(checks.get(m)) for m in TENSOR_METRICS]
    elif mode == "stats":
        cells = _stat_cells(npu, bench)
    else:
        crc = record.get("crc32") or {}
        cells = [_text(crc.get("candidate")), _text(crc.get("baseline"))]
    if mode != "hash":
        cells += [_text(x) for x in (npu or [None] * 4)] + [_text(x) for x in (bench or [None] * 4)]
    return cells


def _stat_cells(npu: Sequence[Any] | None, bench: Sequence[Any] | None) -> list[str]:
    if not npu or not bench:
        return [NA] * 8
    diffs = [_num(a) - _num(b) for a, b in zip(npu, bench, strict=True)]
    relative = [
        abs(d / _num(b)) if _num(b) != 0 else (0.0 if d == 0 else math.inf)
        for d, b in zip(diffs, bench, strict=True)
    ]
    return [_text(x) for x in diffs + relative]


def _record_row(entry: Mapping[str, Any], record: Mapping[str, Any], mode: str) -> list[str]:
    status = str(record.get("status"))
    failing = next((c for c in record.get("checks", []) if not c.get("passed")), None)
    shown = failing or max(record.get("checks", []), key=lambda c: _num(c.get("value")), default=None)
    name = str(record.get("name"))
    basic = [
        str(record.get("candidate_name") or name),
        name,
        _text(record.get("candidate_dtype")),
        _text(record.get("dtype")),
        _shape(record.get("candidate_shape")),
        _shape(record.get("shape")),
        NA,
        NA,
    ]
    reached = status == "ok"
    message = "" if reached else _message(status, failing)
    result = [NA, "pass" if reached else "error", message] + ([NA] if mode == "tensor" else [])
    ours = [
        "Yes" if reached else "No",
        str(entry.get("name")),
        str(entry.get("phase")),
        str(record.get("kind")),
        str(record.get("slot")),
        str(record.get("step")),
        status,
        str(shown.get("metric")) if shown else "",
        _text(shown.get("value")) if shown else "",
        _text(shown.get("allowed")) if shown else "",
        str(record.get("rule") or ""),
        _origin_mark(entry, record),
    ]
    return basic + _middle(record, mode) + result + ours


def _message(status: str, failing: Mapping[str, Any] | None) -> str:
    if status == "shape":
        return "shapes differ"
    if failing is None:
        return status
    relation = ">" if failing.get("upper", True) else "<"
    return f"{failing.get('metric')} {_text(failing.get('value'))} {relation} {_text(failing.get('allowed'))}"


def _origin_mark(entry: Mapping[str, Any], record: Mapping[str, Any]) -> str:
    """ "origin" on the case's origin record (its phase and step), "first divergence" on the
    phase's first divergence when that is not the origin."""
    origin = entry.get("origin") or {}
    first = entry.get("first_divergence") or {}
    at = (record.get("name"), entry.get("phase"), record.get("step"), record.get("kind"))
    if origin and at == (origin.get("record"), origin.get("phase"), origin.get("step"), origin.get("kind")):
        return "origin"
    if first and at == (first.get("name"), entry.get("phase"), first.get("step"), first.get("kind")):
        return "first divergence"
    return ""


def _unmatched_row(entry: Mapping[str, Any], u: Mapping[str, Any], side: str, mode: str) -> list[str]:
    name = str(u.get("name"))
    basic = [NA, name] if side == "baseline" else [name, NA]
    basic += [NA] * 6
    middle = [NA] * len(MODE_COLUMNS[mode] + (SUMMARY if mode != "hash" else []))
    reason = str(u.get("reason") or "no counterpart (no mapping rule or reason says why)")
    result = [NA, "unmatched", reason] + ([NA] if mode == "tensor" else [])
    ours = ["No", str(entry.get("name")), str(entry.get("phase")), str(u.get("kind")), str(u.get("slot")), NA]
    ours += [f"only_{side}", "", "", "", "", ""]
    return basic + middle + result + ours
