"""The training run in report.html: the verdict in words and per-step curves of both sides
(loss, LR of the first parameter group, grad norm, and |candidate - baseline| of the loss),
with the first divergent step marked. Inline SVG, as ``chart`` draws its charts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .chart import esc, fmt, num

W, H = 300, 170
LEFT, RIGHT, TOP, BOTTOM = 54, 10, 22, 30
TITLES = {"loss": "loss", "lr": "learning rate (group 0)", "grad_norm": "grad norm", "loss_diff": "|Δ loss|"}


def training_section(training: Mapping[str, Any] | None) -> str:
    """The case's training section ("" for a case that is not a training run)."""
    if not training:
        return ""
    curves: Mapping[str, Any] = training.get("curves") or {}
    steps = [int(s) for s in curves.get("steps") or []]
    first = training.get("first_divergent_step")
    panels = [
        _panel(name, steps, curves[name], first) for name in ("loss", "lr", "grad_norm") if name in curves
    ]
    loss = curves.get("loss") or {}
    if "baseline" in loss and "candidate" in loss:
        diff = [
            abs(num(b) - num(a)) if a is not None and b is not None else None
            for a, b in zip(loss["baseline"], loss["candidate"], strict=False)
        ]
        panels.append(_panel("loss_diff", steps, {"difference": diff}, first))
    return (
        f'<div class="training" data-first-step="{esc(first if first is not None else "")}">'
        f"<h3>Training run</h3><p>{esc(_story(training))}</p>"
        + (
            f'<p class="replay">{esc(replay["story"])}</p>'
            if isinstance(replay := training.get("replay"), Mapping)
            else ""
        )
        + "".join(f'<p class="finding">{esc(f)}</p>' for f in training.get("findings") or [])
        + f'<div class="training-charts">{"".join(panels)}</div></div>'
    )


def _story(training: Mapping[str, Any]) -> str:
    steps, lane = training.get("steps_compared"), training.get("lane")
    if training.get("first_divergent") is None:
        return f"{steps} step(s) compared ({lane} lane): " + (
            "aligned" if not training.get("findings") else "the runs do not line up"
        )
    text = (
        f"Step {training.get('first_divergent_step')} diverged first: {training.get('first_divergent')}, "
        f"origin {training.get('origin')} — {training.get('evidence')}"
    )
    for key in ("pattern", "downstream"):
        if training.get(key):
            text += f"; {training[key]}"
    return text + f" ({steps} step(s) compared, {lane} lane)"


def _panel(name: str, steps: Sequence[int], sides: Mapping[str, Any], first: Any) -> str:
    series = {side: [num(v) if v is not None else math.nan for v in values] for side, values in sides.items()}
    values = [v for vs in series.values() for v in vs if math.isfinite(v)]
    if not steps or not values:
        return ""
    low, high = min(values), max(values)
    if high == low:
        low, high = low - (abs(low) or 1.0) * 0.05, high + (abs(high) or 1.0) * 0.05
    span = max(steps[-1] - steps[0], 1)

    def x(step: float) -> float:
        return LEFT + (step - steps[0]) / span * (W - LEFT - RIGHT)

    def y(v: float) -> float:
        return TOP + (high - v) / (high - low) * (H - TOP - BOTTOM)

    parts = [
        f'<rect class="plot-bg" x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}"/>',
        f'<text class="tick" x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end">{esc(fmt(high))}</text>',
        f'<text class="tick" x="{LEFT - 4}" y="{H - BOTTOM}" text-anchor="end">{esc(fmt(low))}</text>',
        f'<text class="tick" x="{LEFT}" y="{H - BOTTOM + 14}">step {steps[0]}</text>',
        f'<text class="tick" x="{W - RIGHT}" y="{H - BOTTOM + 14}" text-anchor="end">step {steps[-1]}</text>',
        f'<text class="axis-label" x="{LEFT}" y="{TOP - 8}">{esc(TITLES[name])}</text>',
    ]
    for side, vs in series.items():
        points = " ".join(
            f"{x(s):.1f},{y(v):.1f}" for s, v in zip(steps, vs, strict=False) if math.isfinite(v)
        )
        parts.append(f'<polyline class="curve {esc(side)}" data-side="{esc(side)}" points="{points}"/>')
    if isinstance(first, int):
        fx = x(first)
        parts.append(f'<line class="first-step" x1="{fx:.1f}" x2="{fx:.1f}" y1="{TOP}" y2="{H - BOTTOM}"/>')
        parts.append(f'<text class="first-step-label" x="{fx + 3:.1f}" y="{TOP + 12}">step {first}</text>')
    return (
        f'<svg class="training-chart" data-curve="{esc(name)}" viewBox="0 0 {W} {H}" role="img" '
        f'aria-label="{esc(TITLES[name])} per step">{"".join(parts)}</svg>'
    )


TRAINING_CSS = """
.training-charts { display:grid; grid-template-columns:repeat(auto-fill,minmax(280px,1fr)); gap:8px; }
svg.training-chart { width:100%; height:auto; background:#fff; }
svg .curve { fill:none; stroke-width:1.6; } svg .curve.baseline { stroke:#2563eb; }
svg .curve.candidate { stroke:#d97706; stroke-dasharray:5 3; } svg .curve.difference { stroke:#c81e1e; }
svg .first-step { stroke:#c81e1e; stroke-dasharray:4 3; } svg .first-step-label { font-size:11px; fill:#c81e1e; }
.training p.finding { color:#c81e1e; }
"""
