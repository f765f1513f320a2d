"""The error-vs-depth chart of report.html: report.json records -> rows -> inline SVG.

x is a record's position in the phase's execution order, y the error of the check that gates
it on a log axis, and the tolerance each record is held to is a step line. Drawn here as SVG
text (no plotting library, nothing fetched), so tests can read the geometry back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from ..compare.pairs import Check, explaining_check
from .text import fmt_number

# Checks whose value is an error that a log axis can show next to its bound. Lower bounds
# (cosine, ...) and hashes/shapes are verdicts, not magnitudes: such failures sit on the top edge.
PLOTTABLE = ("allclose", "max_abs", "max_rel", "mean_abs", "euclidean")
AXIS_LABELS = {
    "allclose": "|candidate − baseline| at the worst element",
    "stats": "|candidate − baseline| of a statistic",
    "max_abs": "max |candidate − baseline|",
    "max_rel": "max relative error",
    "mean_abs": "mean |candidate − baseline|",
    "euclidean": "‖candidate − baseline‖₂",
}


# Chart geometry (SVG user units; the SVG scales to the page width).
WIDTH, HEIGHT = 960, 300
LEFT, RIGHT, TOP, BOTTOM = 78, 24, 30, 48


def num(value: Any) -> float:
    """report.json writes non-finite floats as strings ("inf", "nan")."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def fmt(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return fmt_number(x, digits=4)


def esc(value: Any) -> str:
    return escape(str(value), quote=True)


# -- the record a chart point and a table row stand for ----------------------------------------


def plottable(check: Check) -> bool:
    """An upper-bound error a log axis can show next to its bound."""
    return check.upper and (check.metric in PLOTTABLE or check.metric.startswith("stats."))


@dataclass(frozen=True)
class Row:
    index: int  # position in the phase's execution order (the chart's x)
    name: str
    kind: str
    slot: str
    step: int
    call: int
    status: str
    evidence: str
    checks: tuple[Check, ...]
    atol: float
    rtol: float

    @property
    def failed(self) -> bool:
        return self.status != "ok"

    @property
    def shown(self) -> Check | None:
        """The check the table shows: the failing one, else the tightest."""
        return explaining_check(self.checks)

    @property
    def plotted(self) -> Check | None:
        """The check the chart draws: a failing plottable one, else the tightest plottable."""
        return explaining_check([c for c in self.checks if plottable(c)])

    @property
    def label(self) -> str:
        slot = f" {self.slot}" if self.slot not in ("", "out") else ""
        return f"{self.name}{slot}"


def rows_from_records(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    rows = []
    for i, r in enumerate(records):
        checks = tuple(
            Check(
                str(c.get("metric", "")),
                num(c.get("value")),
                num(c.get("allowed")),
                bool(c.get("passed")),
                bool(c.get("upper", True)),
            )
            for c in r.get("checks", [])
        )
        rows.append(
            Row(
                index=i,
                name=str(r.get("name", "")),
                kind=str(r.get("kind", "")),
                slot=str(r.get("slot", "")),
                step=int(r.get("step", 0)),
                call=int(r.get("call", 0)),
                status=str(r.get("status", "")),
                evidence=str(r.get("evidence", "")),
                checks=checks,
                atol=num(r.get("atol")),
                rtol=num(r.get("rtol")),
            )
        )
    return rows


def first_index(rows: Sequence[Row], first: Mapping[str, Any] | None) -> int | None:
    if not first:
        return None
    key = (first.get("name"), first.get("kind"), first.get("slot"), first.get("step"), first.get("call"))
    return next((r.index for r in rows if (r.name, r.kind, r.slot, r.step, r.call) == key), None)


# -- the chart ---------------------------------------------------------------------------------


def _decades(rows: Sequence[Row]) -> tuple[int, int]:
    """The log axis range, whole decades around every finite positive value and bound."""
    values = []
    for row in rows:
        check = row.plotted
        if check is not None:
            values += [v for v in (check.value, check.allowed) if v > 0 and math.isfinite(v)]
    if not values:
        return -8, 0
    lo = math.floor(math.log10(min(values)))
    hi = math.ceil(math.log10(max(values)))
    if hi - lo < 2:  # keep at least two decades so that a flat series has room
        lo, hi = lo - 1, hi + 1
    return lo, hi


def _axis_label(rows: Sequence[Row]) -> str:
    metrics = {("stats" if c.metric.startswith("stats.") else c.metric) for r in rows if (c := r.plotted)}
    if len(metrics) == 1:
        return AXIS_LABELS.get(metrics.pop(), "error")
    return "error of the tightest check (see table)"


def _power(exp: int) -> str:
    return f'10<tspan dy="-6" font-size="9">{exp}</tspan>'


def chart_svg(phase: str, rows: Sequence[Row], first: int | None) -> str:
    """Error vs depth: one point per record (x: execution order; y: log error) and the
    tolerance each record is held to as a step line."""
    n = len(rows)
    if not any(r.plotted is not None for r in rows):
        return _strip_svg(phase, rows, first)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    lo, hi = _decades(rows)
    floor = 10.0**lo

    def x(i: float) -> float:
        return LEFT + (i + 0.5) * plot_w / max(n, 1)

    def y(v: float) -> float:
        v = min(max(v, floor), 10.0**hi)
        return TOP + plot_h * (hi - math.log10(v)) / (hi - lo)

    parts = [
        f'<svg class="chart" data-phase="{esc(phase)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{esc(phase)} error versus depth, log scale">',
        f'<rect class="plot-bg" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]
    step = 1 if hi - lo <= 10 else 2
    for exp in range(lo, hi + 1, step):
        gy = y(10.0**exp)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{gy:.1f}" y2="{gy:.1f}"/>')
        parts.append(
            f'<text class="tick y" x="{LEFT - 8}" y="{gy + 4:.1f}" text-anchor="end">{_power(exp)}</text>'
        )
    parts += _x_axis(rows, x, plot_h, HEIGHT, first)
    parts.append(
        f'<text class="axis-label" transform="translate(16 {TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{esc(_axis_label(rows))}</text>'
    )
    parts.append(_tolerance_path(rows, x, y, plot_w / max(n, 1)))
    parts.extend(_points(rows, x, y, floor, TOP))
    parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _x_axis(rows: Sequence[Row], x: Any, plot_h: float, height: float, first: int | None) -> list[str]:
    """Index ticks, the axis label and the first divergence's dashed line."""
    n = len(rows)
    parts = [
        f'<line class="axis" x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}"/>'
        f'<text class="tick x" x="{x(i):.1f}" y="{TOP + plot_h + 17}" text-anchor="middle">{i}</text>'
        for i in _ticks(n)
    ]
    parts.append(
        f'<text class="axis-label" x="{LEFT + (WIDTH - LEFT - RIGHT) / 2}" y="{height - 8}" '
        f'text-anchor="middle">record, in execution order (depth →)</text>'
    )
    if first is not None:
        fx, right = x(first), first < n * 0.6
        parts.append(
            f'<line class="first-line" x1="{fx:.1f}" x2="{fx:.1f}" y1="{TOP}" y2="{TOP + plot_h}"/>'
            f'<text class="first-label" x="{fx + (4 if right else -4):.1f}" y="{TOP - 8}" '
            f'text-anchor="{"start" if right else "end"}">first divergence: {esc(rows[first].label)}</text>'
        )
    return parts


STRIP_HEIGHT = 130


def _strip_svg(phase: str, rows: Sequence[Row], first: int | None) -> str:
    """No record has an error magnitude (hashes, lower bounds): one row of equal/different marks."""
    n = len(rows)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, STRIP_HEIGHT - TOP - BOTTOM
    mid = TOP + plot_h / 2

    def x(i: float) -> float:
        return LEFT + (i + 0.5) * plot_w / max(n, 1)

    parts = [
        f'<svg class="chart strip" data-phase="{esc(phase)}" viewBox="0 0 {WIDTH} {STRIP_HEIGHT}" '
        f'role="img" aria-label="{esc(phase)}: which records match">',
        f'<rect class="plot-bg" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>',
        f'<text class="tick y" x="{LEFT - 8}" y="{mid + 4:.1f}" text-anchor="end">match?</text>',
    ]
    parts += _x_axis(rows, x, plot_h, STRIP_HEIGHT, first)
    for row in rows:
        shown = row.shown
        what = f"{shown.metric} {fmt(shown.value)} vs {fmt(shown.allowed)}" if shown else row.status
        state = "fail" if row.failed else "pass"
        parts.append(_circle(x(row.index), mid, state, "", f"#{row.index} {row.label} ({row.kind}): {what}"))
    parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/></svg>')
    return "".join(parts)


def _ticks(n: int) -> list[int]:
    if n <= 1:
        return [0] if n else []
    raw = (n - 1) / 10
    base = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    spacing = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    return list(range(0, n, int(spacing)))


def _tolerance_path(rows: Sequence[Row], x: Any, y: Any, band: float) -> str:
    """A step line: each record's bound across its own slot; gaps where none applies."""
    d: list[str] = []
    pen_down = False
    last = None
    for row in rows:
        check = row.plotted
        if check is None or not math.isfinite(check.allowed):
            pen_down = False
            continue
        x0, x1, yy = x(row.index) - band / 2, x(row.index) + band / 2, y(check.allowed)
        if pen_down and last is not None and last == row.index - 1:
            d.append(f"L{x0:.1f},{yy:.1f}")
        else:
            d.append(f"M{x0:.1f},{yy:.1f}")
        d.append(f"L{x1:.1f},{yy:.1f}")
        pen_down, last = True, row.index
    return f'<path class="tolerance" d="{" ".join(d)}"><title>tolerance (allowed)</title></path>' if d else ""


def _points(rows: Sequence[Row], x: Any, y: Any, floor: float, top: float) -> list[str]:
    out = []
    for row in rows:
        check = row.plotted
        state = "fail" if row.failed else "pass"
        if check is None:
            if not row.failed:
                continue  # a passing hash or lower-bound check: nothing to draw on this axis
            shown = row.shown
            what = f"{shown.metric} {fmt(shown.value)} vs {fmt(shown.allowed)}" if shown else row.status
            out.append(
                _marker(
                    x(row.index), top, state, "off", f"{row.label} ({row.kind}): {what} (not on this axis)"
                )
            )
            continue
        title = f"#{row.index} {row.label} ({row.kind}): {check.metric} {fmt(check.value)}, allowed {fmt(check.allowed)}"
        if not math.isfinite(check.value):
            out.append(_marker(x(row.index), top, state, "off", title))
        elif check.value <= 0:
            out.append(
                _circle(x(row.index), y(floor), state, "zero", title + " (exact zero, drawn at the floor)")
            )
        else:
            out.append(_circle(x(row.index), y(check.value), state, "", title))
    return out


def _circle(cx: float, cy: float, state: str, extra: str, title: str) -> str:
    r = 4.2 if state == "fail" else 3.0
    cls = f"point {state} {extra}".strip()
    return f'<circle class="{cls}" cx="{cx:.1f}" cy="{cy:.1f}" r="{r}"><title>{esc(title)}</title></circle>'


def _marker(cx: float, top: float, state: str, extra: str, title: str) -> str:
    cls = f"point {state} {extra}"
    pts = f"{cx - 5:.1f},{top + 1:.1f} {cx + 5:.1f},{top + 1:.1f} {cx:.1f},{top + 9:.1f}"
    return f'<polygon class="{cls}" points="{pts}"><title>{esc(title)}</title></polygon>'


def chart_notes(rows: Sequence[Row]) -> list[str]:
    if rows and not any(r.plotted is not None for r in rows):
        return ["no record has an error magnitude (hash or lower-bound checks): each is equal or not"]
    notes = []
    zeros = sum(1 for r in rows if (c := r.plotted) is not None and math.isfinite(c.value) and c.value <= 0)
    if zeros:
        notes.append(f"{zeros} exact zero(s) drawn as hollow points on the floor of the log axis")
    off = sum(
        1
        for r in rows
        if ((c := r.plotted) is None and r.failed) or (c is not None and not math.isfinite(c.value))
    )
    if off:
        notes.append(
            f"{off} failing record(s) not on this axis (NaN/Inf, shape, hash or lower bound): ▼ on the top edge"
        )
    hidden = sum(1 for r in rows if r.plotted is None and not r.failed)
    if hidden:
        notes.append(
            f"{hidden} passing record(s) checked without an error magnitude (hash or lower bound) not drawn"
        )
    return notes
