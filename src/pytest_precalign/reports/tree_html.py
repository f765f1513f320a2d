"""The module tree's part of report.html: per case a ``role="tree"`` of the baseline's modules
(data from ``tree.case_tree``, embedded as JSON and drawn by a small inline script), with a
phase switch, a search box, filters, a legend and a panel showing the clicked node's records.

Collapsed by default except the path to the case's origin (``data-origin="true"``), which is
open on load. Keyboard: Up/Down move, Right/Left open/close, Enter/Space selects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .chart import esc
from .tree import case_tree

BAND_TEXT = {
    "aligned": "aligned",
    "close": "close to bound (value/allowed > 0.5)",
    "over": "over bound",
    "nonfinite": "non-finite",
    "unmatched": "unmatched",
    "none": "not recorded",
}
FILTERS = (
    ("over", "over tolerance (non-finite too)"),
    ("unmatched", "unmatched"),
    ("nonfinite", "non-finite"),
)


def tree_section(case_id: str, name: str, phases: Sequence[Mapping[str, Any]]) -> str:
    """The tree of one case (its phase entries in phase order); "" when nothing was recorded."""
    data = case_tree(phases)
    if len(data["nodes"]) <= 1:
        return ""
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    switch = "".join(
        f'<button type="button" role="radio" data-phase="{esc(p)}" '
        f'aria-checked="{"true" if i == 0 else "false"}">{esc(p)}</button>'
        for i, p in enumerate(data["phases"])
    )
    filters = "".join(
        f'<label><input type="checkbox" class="tree-filter" value="{key}"> {esc(text)}</label>'
        for key, text in FILTERS
    )
    legend = "".join(
        f'<span class="band-key"><span class="band b-{key}"></span>{esc(text)}</span>'
        for key, text in BAND_TEXT.items()
    )
    origin = data["origin"]
    where = (
        f"origin <code>{esc(origin['path'] or '(model)')}</code> ({esc(origin['phase'])}) is marked ◆ and opened"
        if origin
        else "no origin: every node is collapsed"
    )
    return (
        f'<section class="tree-view" id="{esc(case_id)}-tree" data-case="{esc(name)}">'
        f'<h3>Module tree <span class="muted">({len(data["nodes"]) - 1} modules and records; {where})</span></h3>'
        f'<div class="tree-controls"><span class="muted">phase</span>'
        f'<span class="phase-switch" role="radiogroup" aria-label="phase">{switch}</span>'
        f'<input type="search" class="tree-search" aria-label="search modules" '
        f'placeholder="search a module (baseline or candidate name)">{filters}'
        f'<span class="tree-count muted" aria-live="polite"></span></div>'
        f'<div class="tree-legend">{legend}</div>'
        f'<div class="tree-body"><ul class="tree" role="tree" aria-label="module tree of {esc(name)}"></ul>'
        f'<div class="tree-detail" aria-live="polite"><p class="muted">Click a node to see its records.</p></div></div>'
        f'<script type="application/json" class="tree-data">{payload}</script></section>'
    )


TREE_CSS = """
section.tree-view { border-top:1px solid var(--line); margin-top:12px; }
.tree-controls { display:flex; flex-wrap:wrap; gap:6px 12px; align-items:center; margin:4px 0 6px; }
.phase-switch button { font:inherit; border:1px solid var(--line); background:#fff; padding:2px 10px; cursor:pointer; }
.phase-switch button[aria-checked="true"] { background:var(--fg); color:#fff; }
.tree-search { font:inherit; padding:3px 8px; min-width:260px; border:1px solid #bcccdc; border-radius:4px; }
.tree-legend { font-size:12px; color:var(--muted); margin-bottom:6px; }
.band-key { margin-right:14px; white-space:nowrap; }
.band { display:inline-block; width:10px; height:14px; border-radius:2px; margin-right:5px; vertical-align:-2px; }
.b-aligned { background:#1f8a4c; } .b-close { background:#e3a008; } .b-over { background:#c81e1e; }
.b-nonfinite { background:#5b0b0b; } .b-unmatched { background:#8e8e8e; } .b-none { background:#e4e7eb; }
.tree-body { display:grid; grid-template-columns:minmax(320px, 1fr) minmax(300px, 1.25fr); gap:12px; }
ul.tree, ul.tree ul { list-style:none; margin:0; padding-left:16px; }
ul.tree { padding-left:0; max-height:520px; overflow:auto; border:1px solid var(--line); border-radius:6px; padding:4px; }
li[aria-expanded="false"] > ul { display:none; } li.hidden { display:none; }
.node { display:flex; gap:6px; align-items:baseline; padding:1px 4px; cursor:pointer; border-radius:3px; white-space:nowrap; }
.node:hover { background:#eef2f7; } li[aria-selected="true"] > .node { background:#dbeafe; }
li:focus { outline:none; } li:focus > .node { outline:2px solid var(--blue); }
.twisty { width:12px; color:var(--muted); } li[aria-expanded="true"] > .node .twisty::before { content:"▾"; }
li[aria-expanded="false"] > .node .twisty::before { content:"▸"; }
.node .cand { color:var(--muted); font-size:12px; } .node .state { font-size:11.5px; color:var(--muted); }
li[data-origin="true"] > .node .name { font-weight:700; color:var(--fail); }
li.match > .node .name { background:#fef08a; }
.tree-detail { border:1px solid var(--line); border-radius:6px; padding:6px 10px; max-height:520px; overflow:auto; }
.tree-detail table td { white-space:nowrap; }
"""

# Draws each case's tree from its JSON, then wires the phase switch, search, filters and keys.
TREE_JS = r"""
document.querySelectorAll("section.tree-view").forEach(function (view) {
  var data = JSON.parse(view.querySelector("script.tree-data").textContent);
  var N = data.nodes, rows = data.rows, phase = data.phases[0], lis = [];
  var TEXT = {aligned: "aligned", close: "close to bound", over: "over bound", nonfinite: "non-finite",
              unmatched: "unmatched", none: "not recorded"};
  var root = view.querySelector("ul.tree"), detail = view.querySelector(".tree-detail");
  var opened = {}; data.open.forEach(function (i) { opened[i] = true; });
  function cell(x) { return x === null ? "-" : typeof x === "number" && !Number.isInteger(x) ? x.toPrecision(4) : String(x); }
  function ratio(x) { return x === "inf" ? "∞" : (typeof x === "number" ? x.toPrecision(3) : "-"); }
  function make(top) {  // a loop, not recursion: a module path may be thousands deep
    var stack = [[top, 1, null]], first = null;
    while (stack.length) {
    var item = stack.pop(), i = item[0], depth = item[1];
    var n = N[i], li = document.createElement("li"), row = document.createElement("div");
    li.setAttribute("role", "treeitem"); li.dataset.index = i; li.dataset.path = n[1];
    li.setAttribute("aria-level", depth); li.tabIndex = -1;
    if (data.origin && data.origin.path === n[1]) li.dataset.origin = "true";
    row.className = "node";
    row.innerHTML = '<span class="twisty"></span><span class="band"></span><span class="name"></span>' +
      '<span class="cand"></span><span class="state"></span>';
    row.querySelector(".name").textContent = n[0] + (li.dataset.origin ? " ◆ origin" : "");
    if (n[2]) row.querySelector(".cand").textContent = "candidate: " + n[2];
    li.title = n[1] || "(model)";
    li.appendChild(row); lis[i] = li;
    if (item[2]) item[2].appendChild(li); else first = li;
    if (n[4].length) {
      li.setAttribute("aria-expanded", opened[i] ? "true" : "false");
      var ul = document.createElement("ul"); ul.setAttribute("role", "group");
      li.appendChild(ul);
      for (var k = n[4].length - 1; k >= 0; k--) stack.push([n[4][k], depth + 1, ul]);
    }
    }
    return first;
  }
  root.appendChild(make(0));
  function paint() {
    var code = data.bands;
    N.forEach(function (n, i) {
      var band = code[n[5][phase] || 0], li = lis[i];
      li.dataset.band = band;
      li.querySelector(".band").className = "band b-" + band;
      var worst = n[7][phase];
      li.querySelector(".state").textContent = TEXT[band] + (worst !== undefined && band !== "unmatched" && band !== "none" ? " · " + ratio(worst) + "× allowed" : "") +
        (((n[6][phase] || 0) & 2) && band !== "unmatched" ? " · unmatched below" : "");
    });
  }
  function visible() { return Array.prototype.filter.call(root.querySelectorAll("li"), function (li) { return li.offsetParent !== null; }); }
  function openPath(i) { for (var p = N[i][3]; p >= 0; p = N[p][3]) lis[p].setAttribute("aria-expanded", "true"); }
  function apply() {
    var q = view.querySelector(".tree-search").value.trim().toLowerCase(), mask = 0, FL = {over: 12, unmatched: 2, nonfinite: 8};
    view.querySelectorAll(".tree-filter:checked").forEach(function (c) { mask |= FL[c.value]; });
    var keep = {}, shown = 0;
    N.forEach(function (n, i) {
      lis[i].classList.remove("match", "hidden");
      if (n[4].length) lis[i].setAttribute("aria-expanded", opened[i] ? "true" : "false");
    });
    if (!q && !mask) { view.querySelector(".tree-count").textContent = ""; return; }
    N.forEach(function (n, i) {
      var own = 0;
      n[8].forEach(function (r) { if (rows[r][0] === phase) own |= FL[rows[r][9]] || 0; });
      var hit = (!q || n[1].toLowerCase().indexOf(q) >= 0 || n[2].toLowerCase().indexOf(q) >= 0) && (!mask || (own & mask));
      if (!hit || i === 0) return;
      shown++; lis[i].classList.add("match"); keep[i] = true; openPath(i);
      for (var p = N[i][3]; p >= 0; p = N[p][3]) keep[p] = true;
    });
    N.forEach(function (n, i) { if (!keep[i] && i !== 0) lis[i].classList.add("hidden"); });
    view.querySelector(".tree-count").textContent = shown + " matching";
  }
  function show(i) {
    root.querySelectorAll('li[aria-selected="true"]').forEach(function (li) { li.setAttribute("aria-selected", "false"); });
    lis[i].setAttribute("aria-selected", "true");
    var n = N[i], head = "<tr><th>phase</th><th>kind</th><th>slot</th><th>step</th><th>metric</th>" +
      "<th>value</th><th>allowed</th><th>value/allowed</th><th>band</th></tr>";
    var body = n[8].map(function () { return "<tr>" + new Array(10).join("<td></td>") + "</tr>"; }).join("");
    detail.innerHTML = "<h4></h4><p class='muted'></p>" + (n[8].length ? "<table class='node-records'><thead>" + head + "</thead><tbody>" + body + "</tbody></table>" : "<p>No records of its own; its band is the worst below it.</p>");
    detail.querySelector("h4").textContent = n[1] || "(model)";
    detail.querySelector("p").textContent = "baseline " + (n[1] || "(model)") + (n[2] ? " · candidate " + n[2] : "");
    var trs = detail.querySelectorAll("tbody tr");
    n[8].forEach(function (r, k) {
      var tds = trs[k].children;
      rows[r].forEach(function (x, j) {  // the record's name is the node's (column 1 left out)
        if (j === 0) tds[0].textContent = x;
        else if (j > 1) tds[j - 1].textContent = j === 8 ? ratio(x) : j === 9 ? TEXT[x] : cell(x);
      });
      trs[k].className = rows[r][9];
    });
  }
  root.addEventListener("click", function (e) {
    var li = e.target.closest("li"); if (!li) return;
    var i = Number(li.dataset.index);
    if (e.target.classList.contains("twisty") && li.hasAttribute("aria-expanded")) {
      var open = li.getAttribute("aria-expanded") !== "true";
      li.setAttribute("aria-expanded", open ? "true" : "false"); opened[i] = open; return;
    }
    show(i); li.focus();
  });
  root.addEventListener("keydown", function (e) {
    var li = e.target.closest("li"); if (!li) return;
    var all = visible(), at = all.indexOf(li), i = Number(li.dataset.index), next = null;
    if (e.key === "ArrowDown") next = all[at + 1];
    else if (e.key === "ArrowUp") next = all[at - 1];
    else if (e.key === "ArrowRight" && li.hasAttribute("aria-expanded")) { li.setAttribute("aria-expanded", "true"); opened[i] = true; }
    else if (e.key === "ArrowLeft" && li.getAttribute("aria-expanded") === "true") { li.setAttribute("aria-expanded", "false"); opened[i] = false; }
    else if (e.key === "Enter" || e.key === " ") show(i);
    else return;
    e.preventDefault(); if (next) { next.tabIndex = 0; next.focus(); }
  });
  view.querySelectorAll(".phase-switch button").forEach(function (b) {
    b.addEventListener("click", function () {
      view.querySelectorAll(".phase-switch button").forEach(function (x) { x.setAttribute("aria-checked", "false"); });
      b.setAttribute("aria-checked", "true"); phase = b.dataset.phase; view.dataset.phase = phase; paint(); apply();
    });
  });
  view.querySelector(".tree-search").addEventListener("input", apply);
  view.querySelectorAll(".tree-filter").forEach(function (c) { c.addEventListener("change", apply); });
  view.dataset.phase = phase; lis[0].tabIndex = 0; paint();
});
"""
