"""report.json's document -> one self-contained ``report.html`` (inline CSS, JS and SVG; no
network). Pure string building: the charts are SVG drawn here, so tests can read them.

Per case and phase: the verdict, the first divergence and where it enters, the worst metric,
an error-vs-depth chart (records in execution order against the error of the check that
gates them, log scale, tolerance as a step line) and a sortable table of the records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from .report import write_text_atomic

PHASE_ORDER = ("forward", "backward", "step")
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
VERDICT_CLASS = {"passed": "pass", "failed": "fail", "expected divergence": "expect"}

# Chart geometry (SVG user units; the SVG scales to the page width).
WIDTH, HEIGHT = 960, 300
LEFT, RIGHT, TOP, BOTTOM = 78, 24, 30, 48


def write_html_report(directory: str | Path, document: Mapping[str, Any]) -> Path:
    """Write ``report.html`` atomically next to report.json."""
    return write_text_atomic(Path(directory) / "report.html", render_html(document))


def _num(value: Any) -> float:
    """report.json writes non-finite floats as strings ("inf", "nan")."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.3e}"
    return f"{x:.4g}"


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


# -- the record a chart point and a table row stand for ----------------------------------------


@dataclass(frozen=True)
class Check:
    metric: str
    value: float
    allowed: float
    passed: bool
    upper: bool

    @property
    def plottable(self) -> bool:
        return self.upper and (self.metric in PLOTTABLE or self.metric.startswith("stats."))

    @property
    def share(self) -> float:
        """value/allowed (upper bounds); how far past the bound for lower ones."""
        if self.upper:
            if self.allowed > 0:
                return self.value / self.allowed
            return 0.0 if self.value == 0 else math.inf
        if self.allowed < 1:
            return (1 - self.value) / (1 - self.allowed)
        return 0.0 if self.value >= 1 else math.inf


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
        bad = [c for c in self.checks if not c.passed]
        if bad:
            return bad[0]
        return max(self.checks, key=lambda c: c.share, default=None)

    @property
    def plotted(self) -> Check | None:
        """The check the chart draws: a failing plottable one, else the tightest plottable."""
        plottable = [c for c in self.checks if c.plottable]
        bad = [c for c in plottable if not c.passed]
        if bad:
            return bad[0]
        return max(plottable, key=lambda c: c.share, default=None)

    @property
    def label(self) -> str:
        slot = f" {self.slot}" if self.slot not in ("", "out") else ""
        return f"{self.name}{slot}"


def _rows(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    rows = []
    for i, r in enumerate(records):
        checks = tuple(
            Check(
                str(c.get("metric", "")),
                _num(c.get("value")),
                _num(c.get("allowed")),
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
                atol=_num(r.get("atol")),
                rtol=_num(r.get("rtol")),
            )
        )
    return rows


def _first_index(rows: Sequence[Row], first: Mapping[str, Any] | None) -> int | None:
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
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    lo, hi = _decades(rows)
    floor = 10.0**lo

    def x(i: float) -> float:
        return LEFT + (i + 0.5) * plot_w / max(n, 1)

    def y(v: float) -> float:
        v = min(max(v, floor), 10.0**hi)
        return TOP + plot_h * (hi - math.log10(v)) / (hi - lo)

    parts = [
        f'<svg class="chart" data-phase="{_e(phase)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{_e(phase)} error versus depth, log scale">',
        f'<rect class="plot-bg" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]
    step = 1 if hi - lo <= 10 else 2
    for exp in range(lo, hi + 1, step):
        gy = y(10.0**exp)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{gy:.1f}" y2="{gy:.1f}"/>')
        parts.append(
            f'<text class="tick y" x="{LEFT - 8}" y="{gy + 4:.1f}" text-anchor="end">{_power(exp)}</text>'
        )
    for i in _ticks(n):
        tx = x(i)
        parts.append(
            f'<line class="axis" x1="{tx:.1f}" x2="{tx:.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}"/>'
            f'<text class="tick x" x="{tx:.1f}" y="{TOP + plot_h + 17}" text-anchor="middle">{i}</text>'
        )
    parts.append(
        f'<text class="axis-label" x="{LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
        f"record, in execution order (depth →)</text>"
        f'<text class="axis-label" transform="translate(16 {TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{_e(_axis_label(rows))}</text>'
    )
    if first is not None:
        fx = x(first)
        parts.append(
            f'<line class="first-line" x1="{fx:.1f}" x2="{fx:.1f}" y1="{TOP}" y2="{TOP + plot_h}"/>'
            f'<text class="first-label" x="{fx + (4 if first < n * 0.6 else -4):.1f}" y="{TOP - 8}" '
            f'text-anchor="{"start" if first < n * 0.6 else "end"}">first divergence: '
            f"{_e(rows[first].label)}</text>"
        )
    parts.append(_tolerance_path(rows, x, y, plot_w / max(n, 1)))
    parts.extend(_points(rows, x, y, floor, TOP))
    parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>')
    parts.append("</svg>")
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
            what = f"{shown.metric} {_fmt(shown.value)} vs {_fmt(shown.allowed)}" if shown else row.status
            out.append(
                _marker(
                    x(row.index), top, state, "off", f"{row.label} ({row.kind}): {what} (not on this axis)"
                )
            )
            continue
        title = f"#{row.index} {row.label} ({row.kind}): {check.metric} {_fmt(check.value)}, allowed {_fmt(check.allowed)}"
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
    return f'<circle class="{cls}" cx="{cx:.1f}" cy="{cy:.1f}" r="{r}"><title>{_e(title)}</title></circle>'


def _marker(cx: float, top: float, state: str, extra: str, title: str) -> str:
    cls = f"point {state} {extra}"
    pts = f"{cx - 5:.1f},{top + 1:.1f} {cx + 5:.1f},{top + 1:.1f} {cx:.1f},{top + 9:.1f}"
    return f'<polygon class="{cls}" points="{pts}"><title>{_e(title)}</title></polygon>'


def _chart_notes(rows: Sequence[Row]) -> list[str]:
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


# -- the table ---------------------------------------------------------------------------------

COLUMNS = (
    ("#", "num"),
    ("record", "text"),
    ("kind", "text"),
    ("step", "num"),
    ("evidence", "text"),
    ("metric", "text"),
    ("value", "num"),
    ("allowed", "num"),
    ("tolerance", "text"),
    ("value / allowed", "num"),
    ("result", "text"),
)


def _sort_key(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x == math.inf else ("-Infinity" if x == -math.inf else repr(x))


def table_html(rows: Sequence[Row]) -> str:
    head = "".join(
        f'<th data-type="{kind}" scope="col" tabindex="0" aria-sort="none">{_e(name)}</th>'
        for name, kind in COLUMNS
    )
    body = []
    for row in rows:
        check = row.shown
        metric = check.metric if check else "-"
        value = check.value if check else math.nan
        allowed = check.allowed if check else math.nan
        share = check.share if check else math.nan
        relation = "" if check is None or check.upper else "≥ "
        tolerance = _tolerance_text(row)
        result = "fail" if row.failed else "pass"
        cells = [
            (str(row.index), _sort_key(row.index)),
            (row.label, row.label),
            (row.kind, row.kind),
            (str(row.step), _sort_key(row.step)),
            (row.evidence, row.evidence),
            (metric, metric),
            (_fmt(value) if check else "-", _sort_key(value)),
            (relation + _fmt(allowed) if check else "-", _sort_key(allowed)),
            (tolerance, tolerance),
            (
                f"{share:.2f}" if check and math.isfinite(share) else _fmt(share) if check else "-",
                _sort_key(share),
            ),
            (result if row.status in ("ok", "fail") else row.status, result),
        ]
        tds = "".join(f'<td data-sort="{_e(key)}">{_e(text)}</td>' for text, key in cells)
        body.append(f'<tr class="{result}">{tds}</tr>')
    return (
        '<div class="table-wrap"><table class="records sortable">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


def _tolerance_text(row: Row) -> str:
    if math.isnan(row.atol):
        return "-"
    if math.isinf(row.atol):
        return "metric bounds only"
    return f"atol {row.atol:.3g} · rtol {row.rtol:.3g}"


# -- the page ----------------------------------------------------------------------------------


def _case_verdict(phases: Sequence[Mapping[str, Any]]) -> str:
    verdicts = [str(p.get("verdict") or ("passed" if p.get("passed") else "failed")) for p in phases]
    for word in ("failed", "expected divergence"):
        if word in verdicts:
            return word
    return "passed"


def _badge(verdict: str) -> str:
    return f'<span class="badge {VERDICT_CLASS.get(verdict, "fail")}">{_e(verdict)}</span>'


def _first_html(first: Mapping[str, Any] | None) -> str:
    if not first:
        return "none: every record is within tolerance"
    where = f"{first.get('kind')}" + (
        f" {first.get('slot')}" if first.get("slot") not in ("", "out", None) else ""
    )
    value, allowed = _num(first.get("value")), _num(first.get("allowed"))
    if first.get("origin"):
        role = "<strong>origin</strong>: its inputs matched, its output did not"
    else:
        module = first.get("origin_module") or "the top level"
        role = f"propagated: its inputs already differed; enters in <code>{_e(module)}</code>"
    text = (
        f'<code class="first-name">{_e(first.get("name"))}</code> ({_e(where)}, step {_e(first.get("step"))}) '
        f"— {_e(first.get('metric'))} {_e(_fmt(value))} &gt; {_e(_fmt(allowed))} allowed; {role}"
    )
    if first.get("origin") and first.get("origin_module") and first.get("origin_module") != first.get("name"):
        text += f" (in <code>{_e(first.get('origin_module'))}</code>)"
    if first.get("first_op"):
        text += f"; first diverging API call <code>{_e(first.get('first_op'))}</code>"
    return text


def _worst_html(worst: Mapping[str, Any] | None) -> str:
    if not worst:
        return "-"
    severity = _num(worst.get("severity"))
    if not math.isfinite(severity):
        share = "beyond its bound"
    elif severity >= 10:
        share = f"{severity:.3g}× its bound"
    else:
        share = f"{severity:.1%} of its bound"
    return (
        f"<code>{_e(worst.get('metric') or '-')}</code> at <code>{_e(worst.get('name'))}</code> "
        f"({_e(worst.get('kind'))}), {share}"
    )


def _phase_html(case_id: str, data: Mapping[str, Any]) -> str:
    phase = str(data.get("phase", ""))
    verdict = str(data.get("verdict") or ("passed" if data.get("passed") else "failed"))
    rows = _rows(data.get("records", []))
    first = _first_index(rows, data.get("first_divergence"))
    facts = [
        ("compared", _compared_html(data, len(rows))),
        ("first divergence", _first_html(data.get("first_divergence"))),
        ("worst metric", _worst_html(data.get("worst"))),
    ]
    if data.get("expectation"):
        facts.append(("expectation", _e(data["expectation"])))
    iso = data.get("isolation")
    if iso:
        facts.append(("isolation", f"true origin <code>{_e(iso.get('origin') or 'none')}</code>"))
    unmatched = data.get("unmatched") or {}
    if unmatched.get("baseline") or unmatched.get("candidate"):
        facts.append(
            (
                "unmatched",
                f"{len(unmatched.get('baseline', []))} baseline-only, "
                f"{len(unmatched.get('candidate', []))} candidate-only",
            )
        )
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in facts)
    plotted = sum(1 for r in rows if r.plotted is not None or r.failed)
    if rows:
        chart = chart_svg(phase, rows, first)
        legend = (
            '<div class="legend"><span class="key pass"></span>within tolerance'
            '<span class="key fail"></span>over tolerance'
            '<span class="key tol"></span>tolerance (allowed)'
            '<span class="key first"></span>first divergence</div>'
        )
        notes = "".join(f"<li>{_e(n)}</li>" for n in _chart_notes(rows))
        figure = (
            f'<figure data-points="{plotted}"><figcaption>{_e(phase)}: error vs depth '
            f"({len(rows)} output records, log scale)</figcaption>{chart}{legend}"
            + (f'<ul class="notes">{notes}</ul>' if notes else "")
            + "</figure>"
        )
        table = (
            f"<details open><summary>Records ({len(rows)}; click a column header to sort)</summary>"
            f"{table_html(rows)}</details>"
        )
    else:
        figure = '<p class="muted">No paired records in this phase.</p>'
        table = ""
    reproduce = data.get("reproduce")
    repro = f'<p class="repro">Reproduce: <code>{_e(reproduce)}</code></p>' if reproduce else ""
    return (
        f'<section class="phase" id="{_e(case_id)}-{_e(phase)}" data-phase="{_e(phase)}" '
        f'data-verdict="{_e(verdict)}"><h3>{_e(phase)} {_badge(verdict)}</h3>'
        f'<dl class="facts">{dl}</dl>{figure}{table}{repro}</section>'
    )


def _compared_html(data: Mapping[str, Any], outputs: int) -> str:
    compared = data.get("compared")
    evidence = compared - outputs if isinstance(compared, int) and compared > outputs else 0
    detail = f" ({outputs} outputs, {evidence} module inputs as evidence)" if evidence else ""
    return _e(f"{compared} records{detail}, {data.get('failed')} over tolerance")


def _display_path(path: str) -> str:
    """Paths under the working directory (pytest's rootdir, usually) are shown relative to it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in text)


def _environment_html(env: Mapping[str, Any]) -> str:
    if not env:
        return ""
    items: list[tuple[str, str]] = []
    versions = env.get("versions")
    if isinstance(versions, Mapping):
        items += [(str(k), str(v)) for k, v in versions.items() if v]
    for key in ("platform", "device", "dtype", "seed", "deterministic", "torch_threads"):
        if key in env:
            items.append((key.replace("_", " "), str(env[key])))
    cells = "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in items)
    return f'<section class="env"><h2>Environment</h2><dl class="env-grid">{cells}</dl></section>'


def render_html(document: Mapping[str, Any]) -> str:
    entries: Sequence[Mapping[str, Any]] = document.get("cases", [])
    cases: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for entry in entries:
        cases.setdefault((str(entry.get("config", "")), str(entry.get("name", ""))), []).append(entry)
    for phases in cases.values():
        phases.sort(key=lambda p: PHASE_ORDER.index(p["phase"]) if p.get("phase") in PHASE_ORDER else 99)
    counts = {"passed": 0, "failed": 0, "expected divergence": 0}
    for entry in entries:
        word = str(entry.get("verdict") or ("passed" if entry.get("passed") else "failed"))
        counts[word] = counts.get(word, 0) + 1

    overview = []
    sections = []
    for (config, name), phases in cases.items():
        case_id = "case-" + _slug(name)
        verdict = _case_verdict(phases)
        for p in phases:
            first = p.get("first_divergence") or {}
            overview.append(
                f'<tr><td><a href="#{_e(case_id)}-{_e(p.get("phase"))}">{_e(name)}</a></td>'
                f"<td>{_e(p.get('phase'))}</td><td>{_badge(str(p.get('verdict') or ('passed' if p.get('passed') else 'failed')))}</td>"
                f"<td>{_e(p.get('compared'))}</td><td>{_e(p.get('failed'))}</td>"
                + (
                    f"<td><code>{_e(first['name'])}</code></td></tr>"
                    if first.get("name")
                    else "<td>-</td></tr>"
                )
            )
        head = phases[0]
        sides = f"baseline <code>{_e(head.get('baseline'))}</code> → candidate <code>{_e(head.get('candidate'))}</code>"
        env = head.get("environment") or {}
        run_facts = ", ".join(f"{k} {env[k]}" for k in ("device", "dtype", "seed") if k in env)
        sections.append(
            f'<section class="case" id="{_e(case_id)}" data-case="{_e(name)}" data-verdict="{_e(verdict)}">'
            f"<h2>{_e(name)} {_badge(verdict)}</h2>"
            f'<p class="muted">{sides}; tolerance table <code>{_e(head.get("table"))}</code>'
            + (f"; {_e(run_facts)}" if run_facts else "")
            + f"; config <code>{_e(_display_path(config))}</code></p>"
            + "".join(_phase_html(case_id, p) for p in phases)
            + "</section>"
        )
    env_doc: Mapping[str, Any] = next((e["environment"] for e in entries if e.get("environment")), {})
    summary = " · ".join(f"{n} {word}" for word, n in counts.items() if n)
    source = document.get("config") or document.get("golden") or ""
    return PAGE.format(
        title=_e(f"precalign report: {Path(str(source)).name}" if source else "precalign report"),
        css=CSS,
        js=JS,
        source=_e(_display_path(str(source))),
        summary=_e(f"{len(entries)} items: {summary}" if entries else "no items"),
        overall=_badge("failed" if counts.get("failed") else "passed"),
        environment=_environment_html(env_doc),
        overview="".join(overview),
        cases="".join(sections),
    )


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style></head>
<body><header><h1>pytest-precalign <span class="muted">alignment report</span> {overall}</h1>
<p class="muted"><code>{source}</code> — <span id="summary">{summary}</span></p></header>
<main>{environment}
<section class="overview"><h2>Overview</h2><table class="overview-table"><thead><tr><th>case</th><th>phase</th>
<th>verdict</th><th>compared</th><th>over tolerance</th><th>first divergence</th></tr></thead>
<tbody>{overview}</tbody></table></section>
{cases}</main>
<script>{js}</script></body></html>
"""

CSS = """
:root { --fg:#1f2933; --muted:#616e7c; --line:#d9e2ec; --bg:#f5f7fa; --pass:#1f8a4c; --fail:#c81e1e;
  --expect:#9a5b00; --blue:#2563eb; --tol:#d97706; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
  color:var(--fg); background:var(--bg); }
header { background:#fff; border-bottom:1px solid var(--line); padding:16px max(28px, calc((100% - 1184px) / 2)); }
h1 { font-size:20px; margin:0 0 4px; } h2 { font-size:17px; margin:0 0 8px; } h3 { font-size:15px; margin:18px 0 8px; }
main { padding:16px 28px; max-width:1240px; margin:0 auto; }
section.case, section.env, section.overview { background:#fff; border:1px solid var(--line); border-radius:8px;
  padding:16px 20px; margin-bottom:18px; }
section.phase { border-top:1px solid var(--line); margin-top:12px; }
.muted { color:var(--muted); font-weight:normal; }
code { font:12.5px/1.3 ui-monospace,"DejaVu Sans Mono",Menlo,monospace; background:#eef2f7; padding:1px 4px; border-radius:3px; }
.badge { display:inline-block; font-size:12px; font-weight:600; padding:2px 9px; border-radius:10px; vertical-align:2px;
  color:#fff; }
.badge.pass { background:var(--pass); } .badge.fail { background:var(--fail); } .badge.expect { background:var(--expect); }
dl.facts { display:grid; grid-template-columns:130px 1fr; gap:4px 12px; margin:0 0 10px; }
dl.facts dt { color:var(--muted); } dl.facts dd { margin:0; }
dl.env-grid { display:grid; grid-template-columns:repeat(auto-fill,minmax(200px,1fr)); gap:6px 16px; margin:0; }
dl.env-grid dt { color:var(--muted); font-size:12px; } dl.env-grid dd { margin:0; font-weight:500; word-break:break-word; }
figure { margin:8px 0 6px; } figcaption { font-weight:600; margin-bottom:4px; }
svg.chart { width:100%; height:auto; display:block; background:#fff; }
svg .plot-bg { fill:#fbfcfe; } svg .frame { fill:none; stroke:#9aa5b1; }
svg .grid { stroke:#e4e9f0; } svg .axis { stroke:#9aa5b1; }
svg .tick { font-size:11px; fill:#52606d; } svg .axis-label { font-size:12px; fill:#323f4b; }
svg .tolerance { fill:none; stroke:var(--tol); stroke-width:1.8; }
svg .point.pass { fill:var(--blue); fill-opacity:.8; } svg .point.fail { fill:var(--fail); stroke:#7f1010; stroke-width:.8; }
svg .point.zero { fill:#fff; stroke:var(--blue); stroke-width:1.2; } svg .point.fail.zero { stroke:var(--fail); }
svg .first-line { stroke:var(--fail); stroke-dasharray:4 3; stroke-width:1.2; }
svg .first-label { font-size:11.5px; fill:var(--fail); font-weight:600; }
.legend { font-size:12px; color:var(--muted); margin-top:4px; }
.legend .key { display:inline-block; width:12px; height:12px; margin:0 5px 0 14px; vertical-align:-2px; border-radius:6px; }
.legend .key:first-child { margin-left:0; }
.legend .key.pass { background:var(--blue); } .legend .key.fail { background:var(--fail); }
.legend .key.tol { height:3px; border-radius:0; background:var(--tol); vertical-align:3px; }
.legend .key.first { width:0; height:12px; border-left:2px dashed var(--fail); border-radius:0; }
ul.notes { margin:4px 0 0; padding-left:18px; font-size:12px; color:var(--muted); }
details summary { cursor:pointer; color:var(--muted); margin:8px 0 4px; }
.table-wrap { max-height:360px; overflow:auto; border:1px solid var(--line); border-radius:6px; }
table { border-collapse:collapse; width:100%; font-size:12.5px; }
th, td { padding:4px 8px; text-align:left; border-bottom:1px solid #edf1f5; white-space:nowrap; }
thead th { position:sticky; top:0; background:#f0f4f8; font-weight:600; }
table.sortable th { cursor:pointer; user-select:none; }
table.sortable th[aria-sort="ascending"]::after { content:" ▲"; font-size:9px; }
table.sortable th[aria-sort="descending"]::after { content:" ▼"; font-size:9px; }
tr.fail td { background:#fdecec; } tr.fail td:last-child { color:var(--fail); font-weight:600; }
td:nth-child(n+7):nth-child(-n+8), td:nth-child(10) { font-variant-numeric:tabular-nums; }
.overview-table td, .overview-table th { white-space:normal; }
.repro { font-size:12px; color:var(--muted); }
"""

# Sorts a table by the clicked column (data-sort holds the raw value; numbers compare as numbers).
JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  var headers = table.querySelectorAll("thead th");
  headers.forEach(function (th, col) {
    function sort() {
      var dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
      headers.forEach(function (h) { h.setAttribute("aria-sort", "none"); });
      th.setAttribute("aria-sort", dir);
      var numeric = th.dataset.type === "num", sign = dir === "ascending" ? 1 : -1;
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.sort, y = b.cells[col].dataset.sort;
        if (numeric) {
          x = Number(x); y = Number(y);
          if (isNaN(x)) return 1; if (isNaN(y)) return -1;
          return x === y ? 0 : (x < y ? -sign : sign);
        }
        return sign * x.localeCompare(y);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    }
    th.addEventListener("click", sort);
    th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
  });
});
"""
