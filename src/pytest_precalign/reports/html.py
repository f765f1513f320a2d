"""report.json's document -> one self-contained ``report.html`` (inline CSS, JS and SVG; no
network). Pure string building; the charts come from ``report_chart``.

Per case: its module tree (``tree_html``). Per case and phase: the verdict, the first
divergence and where it enters, the worst metric, an error-vs-depth chart (records in
execution order against the error of the check that gates them, log scale, tolerance as a
step line) and a sortable table of the records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._atomic import write_file_atomic
from ..compare.tolerances import BOUND_METRICS
from ..verdict.origin_facts import Matched
from ..vocabulary import PHASES
from .chart import Row, chart_notes, chart_svg, esc, first_index, fmt, num, rows_from_records
from .origin_text import module_proof_text
from .training_chart import TRAINING_CSS, training_section
from .tree_html import TREE_CSS, TREE_JS, tree_section

VERDICT_CLASS = {"passed": "pass", "failed": "fail", "expected divergence": "expect"}


def write_html_report(directory: str | Path, document: Mapping[str, Any]) -> Path:
    """Write ``report.html`` atomically next to report.json."""
    return write_file_atomic(Path(directory) / "report.html", render_html(document))


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
        f'<th data-type="{kind}" scope="col" tabindex="0" aria-sort="none">{esc(name)}</th>'
        for name, kind in COLUMNS
    )
    body = []
    for row in rows:
        check = row.shown
        metric = check.metric if check else "-"
        value = check.value if check else math.nan
        allowed = check.allowed if check else math.nan
        share = check.severity if check else math.nan
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
            (fmt(value) if check else "-", _sort_key(value)),
            (relation + fmt(allowed) if check else "-", _sort_key(allowed)),
            (tolerance, tolerance),
            (
                f"{share:.2f}" if check and math.isfinite(share) else fmt(share) if check else "-",
                _sort_key(share),
            ),
            (result if row.status in ("ok", "fail") else row.status, result),
        ]
        tds = "".join(f'<td data-sort="{esc(key)}">{esc(text)}</td>' for text, key in cells)
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
    return f'<span class="badge {VERDICT_CLASS.get(verdict, "fail")}">{esc(verdict)}</span>'


def _first_html(first: Mapping[str, Any] | None) -> str:
    if not first:
        return "none: every record is within tolerance"
    where = f"{first.get('kind')}" + (
        f" {first.get('slot')}" if first.get("slot") not in ("", "out", None) else ""
    )
    value, allowed = num(first.get("value")), num(first.get("allowed"))
    relation = "&gt;" if BOUND_METRICS.get(str(first.get("metric")), True) else "&lt;"
    if first.get("origin"):
        role = "<strong>origin</strong>: " + esc(first.get("proof") or module_proof_text(Matched("inputs")))
    elif first.get("proven") is False and first.get("proof"):
        role = esc(first.get("proof"))
    else:
        module = first.get("origin_module") or "the top level"
        role = f"propagated: its inputs already differed; enters in <code>{esc(module)}</code>"
    text = (
        f'<code class="first-name">{esc(first.get("name"))}</code> ({esc(where)}, step {esc(first.get("step"))}) '
        f"— {esc(first.get('metric'))} {esc(fmt(value))} {relation} {esc(fmt(allowed))} allowed; {role}"
    )
    if first.get("origin") and first.get("origin_module") and first.get("origin_module") != first.get("name"):
        text += f" (in <code>{esc(first.get('origin_module'))}</code>)"
    if first.get("first_op"):
        text += f"; first diverging API call <code>{esc(first.get('first_op'))}</code>"
    return text


def _first_cell(first: Mapping[str, Any], training: Any) -> str:
    """The overview's first divergence: the record, else a training run's first divergent step
    and class (a run judged by its per-step scalars has no record), else ``-``."""
    if first.get("name"):
        return f"<code>{esc(first['name'])}</code>"
    if isinstance(training, Mapping) and training.get("first_divergent_step") is not None:
        origin = training.get("origin")
        tail = f" (<code>{esc(origin)}</code>)" if origin else ""
        return f"step {esc(training['first_divergent_step'])}: {esc(training.get('first_divergent'))}{tail}"
    if isinstance(training, Mapping) and training.get("findings"):
        return f"runs do not line up: {esc(training['findings'][0])}"
    return "-"


def _origin_html(phases: Sequence[Mapping[str, Any]]) -> str:
    """The case's origin (the same in each phase's entry), above its phases."""
    origin = next((p["origin"] for p in phases if isinstance(p.get("origin"), Mapping)), None)
    training = phases[0].get("training") if phases else None
    run_class = training.get("first_divergent") if isinstance(training, Mapping) else None
    if origin is None or run_class not in (None, "forward", "backward", "forward_or_backward"):
        return ""  # a training-loop difference is not told as a layer origin
    word = "Origin" if origin.get("proven") else "Origin unproven"
    return (
        f'<p class="case-origin"><strong>{word}</strong>: <code>{esc(origin.get("module"))}</code> '
        f"({esc(origin.get('phase'))}, step {esc(origin.get('step'))}) — {esc(origin.get('evidence'))}</p>"
    )


def _worst_html(worst: Mapping[str, Any] | None) -> str:
    if not worst:
        return "-"
    severity = num(worst.get("severity"))
    if not math.isfinite(severity):
        share = "beyond its bound"
    elif severity >= 10:
        share = f"{severity:.3g}× its bound"
    else:
        share = f"{severity:.1%} of its bound"
    return (
        f"<code>{esc(worst.get('metric') or '-')}</code> at <code>{esc(worst.get('name'))}</code> "
        f"({esc(worst.get('kind'))}), {share}"
    )


def _unmatched_facts(unmatched: Mapping[str, Any]) -> list[tuple[str, str]]:
    if not unmatched.get("baseline") and not unmatched.get("candidate"):
        return []
    counts = (
        f"{len(unmatched.get('baseline', []))} baseline-only, "
        f"{len(unmatched.get('candidate', []))} candidate-only"
    )
    return [("unmatched", counts + _unexplained_html(unmatched))]


def _phase_html(case_id: str, data: Mapping[str, Any]) -> str:
    phase = str(data.get("phase", ""))
    verdict = str(data.get("verdict") or ("passed" if data.get("passed") else "failed"))
    rows = rows_from_records(data.get("records", []))
    first = first_index(rows, data.get("first_divergence"))
    facts = [
        ("compared", _compared_html(data, len(rows))),
        ("first divergence", _first_html(data.get("first_divergence"))),
        ("worst metric", _worst_html(data.get("worst"))),
    ]
    facts[1:1] = _coverage_facts(data)
    if data.get("downstream_of"):
        facts.insert(0, ("downstream of", f"<code>{esc(data['downstream_of'])}</code>: no origin of its own"))
    if data.get("expectation"):
        facts.append(("expectation", esc(data["expectation"])))
    iso = data.get("isolation")
    if iso:
        facts.append(("isolation", f"true origin <code>{esc(iso.get('origin') or 'none')}</code>"))
    facts.extend(_unmatched_facts(data.get("unmatched") or {}))
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts)
    if rows:
        magnitudes = any(r.plotted is not None for r in rows)
        drawn = sum(1 for r in rows if r.plotted is not None or r.failed) if magnitudes else len(rows)
        chart = chart_svg(phase, rows, first)
        legend = (
            f'<div class="legend"><span class="key pass"></span>{"within tolerance" if magnitudes else "matches"}'
            f'<span class="key fail"></span>{"over tolerance" if magnitudes else "differs"}'
            + ('<span class="key tol"></span>tolerance (allowed)' if magnitudes else "")
            + '<span class="key first"></span>first divergence</div>'
        )
        notes = "".join(f"<li>{esc(n)}</li>" for n in chart_notes(rows))
        what = "error vs depth" if magnitudes else "match vs depth"
        scale = ", log scale" if magnitudes else ""
        figure = (
            f'<figure data-points="{drawn}"><figcaption>{esc(phase)}: {what} '
            f"({len(rows)} output records{scale})</figcaption>{chart}{legend}"
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
    repro = f'<p class="repro">Reproduce: <code>{esc(reproduce)}</code></p>' if reproduce else ""
    return (
        f'<section class="phase" id="{esc(case_id)}-{esc(phase)}" data-phase="{esc(phase)}" '
        f'data-verdict="{esc(verdict)}"><h3>{esc(phase)} {_badge(verdict)}</h3>'
        f'<dl class="facts">{dl}</dl>{figure}{table}{repro}</section>'
    )


def _coverage_facts(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The phase's coverage (paired share of the baseline's output records), and its problem."""
    cov = data.get("coverage")
    if not isinstance(cov, Mapping):
        return []
    ratio, floor = cov.get("ratio"), cov.get("floor")
    if not isinstance(ratio, (int, float)) or not isinstance(floor, (int, float)):
        return []
    text = (
        f"{100 * ratio:.0f}% ({cov.get('paired')} of {cov.get('baseline_outputs')} baseline output "
        f"records paired; floor {100 * floor:.0f}%)"
    )
    facts = [("coverage", esc(text))]
    if cov.get("problem"):
        facts.append(("coverage problem", esc(cov["problem"])))
    return facts


def _unexplained_html(unmatched: Mapping[str, Any]) -> str:
    bare = sum(
        1 for side in ("baseline", "candidate") for u in unmatched.get(side, []) if not u.get("reason")
    )
    return f" ({bare} unexplained: no mapping rule or reason says why)" if bare else ""


def _compared_html(data: Mapping[str, Any], outputs: int) -> str:
    compared = data.get("compared")
    evidence = compared - outputs if isinstance(compared, int) and compared > outputs else 0
    detail = f" ({outputs} outputs, {evidence} module inputs as evidence)" if evidence else ""
    return esc(f"{compared} records{detail}, {data.get('failed')} over tolerance")


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
    cells = "".join(f"<div><dt>{esc(k)}</dt><dd>{esc(v)}</dd></div>" for k, v in items)
    return f'<section class="env"><h2>Environment</h2><dl class="env-grid">{cells}</dl></section>'


def _overall(
    document: Mapping[str, Any], items: int, counts: Mapping[str, int], summary: str
) -> tuple[str, str]:
    """The header's badge and summary line. An interrupted run proves nothing about the items
    that did not run: it is marked interrupted, with no pass badge."""
    if document.get("interrupted"):
        ran = f"{items} of {document.get('collected', '?')} collected items ran"
        text = f"interrupted: {ran}" + (f" ({summary})" if summary else "")
        return '<span class="badge fail">interrupted</span>', text
    text = f"{items} items: {summary}" if items else "no items"
    return _badge("failed" if counts.get("failed") else "passed"), text


def render_html(document: Mapping[str, Any]) -> str:
    entries: Sequence[Mapping[str, Any]] = document.get("cases", [])
    cases: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for entry in entries:
        cases.setdefault((str(entry.get("config", "")), str(entry.get("name", ""))), []).append(entry)
    for phases in cases.values():
        phases.sort(key=lambda p: PHASES.index(p["phase"]) if p.get("phase") in PHASES else 99)
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
                f'<tr><td><a href="#{esc(case_id)}-{esc(p.get("phase"))}">{esc(name)}</a></td>'
                f"<td>{esc(p.get('phase'))}</td><td>{_badge(str(p.get('verdict') or ('passed' if p.get('passed') else 'failed')))}</td>"
                f"<td>{esc(p.get('compared'))}</td><td>{esc(p.get('failed'))}</td>"
                + f"<td>{_first_cell(first, p.get('training'))}</td></tr>"
            )
        head = phases[0]
        sides = f"baseline <code>{esc(head.get('baseline'))}</code> → candidate <code>{esc(head.get('candidate'))}</code>"
        env = head.get("environment") or {}
        run_facts = ", ".join(f"{k} {env[k]}" for k in ("device", "dtype", "seed") if k in env)
        sections.append(
            f'<section class="case" id="{esc(case_id)}" data-case="{esc(name)}" data-verdict="{esc(verdict)}">'
            f"<h2>{esc(name)} {_badge(verdict)}</h2>"
            f'<p class="muted">{sides}; tolerance table <code>{esc(head.get("table"))}</code>'
            + (f"; {esc(run_facts)}" if run_facts else "")
            + f"; config <code>{esc(_display_path(config))}</code></p>"
            + _origin_html(phases)
            + training_section(head.get("training"))
            + tree_section(case_id, name, phases)
            + "".join(_phase_html(case_id, p) for p in phases)
            + "</section>"
        )
    env_doc: Mapping[str, Any] = next((e["environment"] for e in entries if e.get("environment")), {})
    summary = " · ".join(f"{n} {word}" for word, n in counts.items() if n)
    source = document.get("config") or document.get("baseline") or ""
    overall, summary_text = _overall(document, len(entries), counts, summary)
    return PAGE.format(
        title=esc(f"precalign report: {Path(str(source)).name}" if source else "precalign report"),
        css=CSS + TREE_CSS + TRAINING_CSS,
        js=JS + TREE_JS,
        source=esc(_display_path(str(source))),
        summary=esc(summary_text),
        overall=overall,
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
