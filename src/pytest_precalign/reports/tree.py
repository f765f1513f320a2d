"""The module tree of one case, from its report.json entries (one per phase): the baseline's
module hierarchy (dotted record names; an API call sits under its enclosing module, the
record's ``parent``), each node with its band per phase (the worst of its records and of
everything below it), its records summarised (never tensors), both names, and the path to the
case's origin. report.html draws it (``tree_html``); nothing here needs a browser.

Bands, worst first: ``nonfinite`` (NaN/Inf where the other side had none), ``over`` (a
check over its bound), ``close`` (value/allowed > 0.5), ``aligned``, ``unmatched`` (only
records with no counterpart: a compared record below says more than a missing one; the
page still says "unmatched below" and its filter finds them); ``none`` where the phase
recorded nothing in that subtree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .chart import num

BANDS = ("none", "unmatched", "aligned", "close", "over", "nonfinite")
CLOSE = 0.5  # value / allowed above this: close to bound
# filter bits: which bands a subtree holds (the page's "over tolerance", "unmatched", "non-finite")
FLAG = {"close": 1, "unmatched": 2, "over": 4, "nonfinite": 8}
ROOT = "(model)"


@dataclass
class _Node:
    path: str
    label: str
    parent: int
    candidate: str = ""
    children: list[int] = field(default_factory=list)
    band: dict[str, int] = field(default_factory=dict)  # phase -> index in BANDS (subtree)
    flags: dict[str, int] = field(default_factory=dict)  # phase -> FLAG bits (subtree)
    worst: dict[str, float] = field(default_factory=dict)  # phase -> worst value/allowed (subtree)
    records: list[int] = field(default_factory=list)  # indices into the case's record rows


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[_Node] = [_Node("", ROOT, -1)]
        self.index: dict[str, int] = {"": 0}
        self.rows: list[list[Any]] = []

    def node(self, path: str) -> int:
        """The node of a dotted path, made with its missing ancestors (a loop, not recursion:
        a path may be thousands of segments deep)."""
        missing: list[str] = []
        found = self.index.get(path)
        while found is None:
            missing.append(path)
            path = path.rpartition(".")[0]
            found = self.index.get(path)
        for made in reversed(missing):  # outermost first
            self.nodes.append(_Node(made, made.rpartition(".")[2], found))
            at = len(self.nodes) - 1
            self.nodes[found].children.append(at)
            self.index[made] = found = at
        return found

    def add(self, path: str, phase: str, band: str, ratio: float, row: list[Any], candidate: str) -> None:
        at = self.node(path)
        node = self.nodes[at]
        if candidate and candidate != path and not node.candidate:
            node.candidate = candidate
        self.rows.append(row)
        node.records.append(len(self.rows) - 1)
        code = BANDS.index(band)
        while at >= 0:  # the band, flags and worst ratio spread up to the root
            n = self.nodes[at]
            n.band[phase] = max(n.band.get(phase, 0), code)
            n.flags[phase] = n.flags.get(phase, 0) | FLAG.get(band, 0)
            if math.isfinite(ratio) or band in ("over", "nonfinite"):
                n.worst[phase] = max(n.worst.get(phase, 0.0), ratio if not math.isnan(ratio) else math.inf)
            at = n.parent


def _shown_check(record: Mapping[str, Any]) -> Mapping[str, Any] | None:
    checks: Sequence[Mapping[str, Any]] = record.get("checks", [])
    failing = next((c for c in checks if not c.get("passed")), None)
    return failing or max(checks, key=lambda c: _ratio(c), default=None)


def _ratio(check: Mapping[str, Any]) -> float:
    value, allowed = num(check.get("value")), num(check.get("allowed"))
    if not check.get("upper", True):  # a lower bound (cosine): the shortfall from 1
        value, allowed = 1 - value, 1 - allowed
    if allowed > 0:
        return value / allowed
    return 0.0 if value == 0 else math.inf


def record_band(record: Mapping[str, Any], nonfinite: set[tuple[str, str]]) -> tuple[str, float]:
    """A compared record's band and its value/allowed (the check it is judged by)."""
    check = _shown_check(record)
    ratio = _ratio(check) if check is not None else 0.0
    if (str(record.get("name")), str(record.get("kind"))) in nonfinite:
        return "nonfinite", math.inf
    if record.get("status") not in ("ok", None):
        value = num(check.get("value")) if check else 0.0
        return ("nonfinite" if check and not math.isfinite(value) else "over"), ratio
    return ("close" if ratio > CLOSE else "aligned"), ratio


def _path(record: Mapping[str, Any]) -> str:
    name = str(record.get("name"))
    parent = record.get("parent")
    return f"{parent}.{name}" if parent else name


def _add_phase(build: _Builder, entry: Mapping[str, Any]) -> None:
    phase = str(entry.get("phase"))
    nonfinite = {(str(n.get("name")), str(n.get("kind"))) for n in entry.get("nonfinite", [])}
    for record in entry.get("records", []):
        band, ratio = record_band(record, nonfinite)
        check = _shown_check(record) or {}
        row = [
            phase,
            str(record.get("name")),
            str(record.get("kind")),
            str(record.get("slot")),
            record.get("step"),
            check.get("metric", "-"),
            _json_num(num(check.get("value"))) if check else None,
            _json_num(num(check.get("allowed"))) if check else None,
            _json_num(ratio),
            band,
        ]
        build.add(_path(record), phase, band, ratio, row, str(record.get("candidate_name") or ""))
    unmatched = entry.get("unmatched") or {}
    for side in ("baseline", "candidate"):
        for u in unmatched.get(side, []):
            why = f"only in the {side}" + (f": {u.get('reason')}" if u.get("reason") else " (unexplained)")
            row = [
                phase,
                str(u.get("name")),
                str(u.get("kind")),
                str(u.get("slot")),
                None,
                why,
                None,
                None,
                None,
            ]
            build.add(str(u.get("name")), phase, "unmatched", math.nan, [*row, "unmatched"], "")


def _json_num(x: float) -> float | str:
    """Strict JSON: non-finite numbers as report.json writes them."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def origin_path(build_index: Mapping[str, int], origin: Mapping[str, Any] | None) -> str | None:
    """The tree path of the case's origin: its module, else its record, else the longest
    enclosing path the tree has."""
    if not origin:
        return None
    for key in ("module", "record"):
        name = origin.get(key)
        if isinstance(name, str) and name in build_index:
            return name
    name = str(origin.get("module") or origin.get("record") or "")
    while name and name not in build_index:
        name = name.rpartition(".")[0]
    return name or None


def case_tree(phases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The tree data report.html embeds for one case (its phase entries, in phase order)."""
    build = _Builder()
    for entry in phases:
        _add_phase(build, entry)
    origin = next((p["origin"] for p in phases if isinstance(p.get("origin"), Mapping)), None)
    target = origin_path(build.index, origin)
    marked: list[int] = []
    at = build.index[target] if target is not None else -1
    while at >= 0:
        marked.append(at)
        at = build.nodes[at].parent
    return {
        "phases": [str(p.get("phase")) for p in phases],
        "origin": {"path": target, "phase": origin.get("phase") if origin else None} if target else None,
        "open": sorted(marked),  # the origin's path, expanded on load
        "nodes": [
            [
                n.label,
                n.path,
                n.candidate,
                n.parent,
                n.children,
                n.band,
                n.flags,
                {k: _json_num(v) for k, v in n.worst.items()},
                n.records,
            ]
            for n in build.nodes
        ],  # fmt: skip
        "rows": build.rows,
        "bands": list(BANDS),
    }
