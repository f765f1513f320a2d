"""Measured noise -> a tolerance table (rules with a ``why``), amplification, and the files.

``calibrate`` runs the models and measures; this module decides the bounds and writes them.
Rules are grouped per layer, phase and kind (a module's outputs, its inputs, the grads w.r.t.
them, a parameter's grad, the logits, the loss), each bound being
``margin x`` the largest difference any perturbation produced there. Parameters after an
optimizer step are pooled over the whole step (see ``_STEP_WHY``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._atomic import TargetExists, write_file_atomic
from ..errors import ConfigError
from ..redaction import redacted, redacted_text

if TYPE_CHECKING:  # measure imports torch: run_calibration checks the devices first
    from .measure import Measurement, Noise

# Machine epsilon per dtype name: a bound never goes below one ulp at the group's scale.
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
TINY = {
    "float64": 2.2250738585072014e-308,
    "float32": 1.1754943508222875e-38,
    "bfloat16": 1.1754943508222875e-38,
    "float16": 6.103515625e-05,
}
FORWARD_IN, FORWARD_OUT = ("input",), ("activation",)
BACKWARD_IN, BACKWARD_OUT = ("grad_output",), ("grad_input",)
_STEP_WHY = (
    "pooled over every parameter: Adam's update lr*m/(sqrt(v)+eps) turns grad differences near "
    "g=0 into large ones on random elements, so one run's per-tensor maxima do not predict "
    "another's"
)


@dataclass(frozen=True)
class CalibratedRule:
    match: str
    phase: str
    kinds: tuple[str, ...]
    dtype: str
    atol: float
    why: str
    records: int


@dataclass(frozen=True)
class Amplification:
    """One module's error growth under one perturbation: output error / input error."""

    case: str
    perturbation: str
    module: str
    direction: str  # forward (outputs / inputs) or backward (grads w.r.t. inputs / outputs)
    input_error: float  # max |delta| over the inputs (backward: grads w.r.t. the outputs)
    output_error: float
    ratio: float | None  # None when the input error is exactly 0 (the module's own error)
    rel_ratio: float | None  # the same with ||delta|| / ||x||


def bound_text(x: float) -> str:
    """A bound with 3 significant digits, rounded up (never below margin x floor), that YAML
    reads as a float (``1.0e-07``, not ``1e-07``, which PyYAML reads as a string)."""
    if x == 0:
        return "0.0"
    exp = math.floor(math.log10(x))
    mantissa = math.ceil(x / 10.0**exp * 100 - 1e-9) / 100
    if mantissa >= 10:
        mantissa, exp = mantissa / 10, exp + 1
    return f"{mantissa:.2f}e{exp:+03d}"


def _glob_literal(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def build_rules(
    measurements: Sequence[Measurement], margin: float, command: str
) -> tuple[CalibratedRule, ...]:
    ran = [m for m in measurements if not m.skipped]
    groups: dict[tuple[str, str, str, str], list[tuple[Measurement, Noise]]] = {}
    pooled: dict[tuple[str, str], list[tuple[Measurement, Noise]]] = {}
    for m in ran:
        for n in m.noise:
            if n.dtype not in EPS:
                continue
            pooled.setdefault((n.phase, n.dtype), []).append((m, n))
            if n.phase != "step":
                groups.setdefault((n.name, n.phase, n.kind, n.dtype), []).append((m, n))
    rules = [
        _rule(_glob_literal(name), phase, dtype, items, margin, command, f"{name}, {phase} {kind}")
        for (name, phase, kind, dtype), items in groups.items()
    ]
    for (phase, dtype), items in pooled.items():
        if phase == "step":
            rules.append(
                _rule("*", phase, dtype, items, margin, command, f"parameters after a step; {_STEP_WHY}")
            )
    for (phase, dtype), items in pooled.items():
        if phase != "step":
            what = f"any other {phase} record (not measured by name): the largest {phase} floor"
            rule = _rule("*", phase, dtype, items, margin, command, what)
            rules.append(CalibratedRule(rule.match, phase, (), dtype, rule.atol, rule.why, rule.records))
    return tuple(rules)


def _rule(
    match: str,
    phase: str,
    dtype: str,
    items: list[tuple[Measurement, Noise]],
    margin: float,
    command: str,
    what: str,
) -> CalibratedRule:
    per: dict[str, float] = {}
    for m, n in items:
        per[m.perturbation] = max(per.get(m.perturbation, 0.0), n.max_abs)
    worst = max(per, key=lambda p: per[p])
    measured = per[worst]
    scale = max(n.scale for _, n in items)
    ulp = EPS[dtype] * scale if scale > 0 else TINY[dtype]
    floor = max(measured, ulp)
    atol = float(bound_text(margin * floor))
    kinds = tuple(sorted({n.kind for _, n in items}))
    descriptions = {m.perturbation: m.description for m, _ in items}
    others = "; ".join(f"{p}: {bound_text(v)}" for p, v in per.items() if p != worst)
    text = f"{what}. Measured max |delta| {bound_text(measured)} under {worst} ({descriptions[worst]})"
    if others:
        text += f" [other perturbations: {others}]"
    if measured < ulp:
        zero = "bitwise equal" if measured == 0 else f"{bound_text(measured)}"
        text += f"; {zero} is below {dtype} eps x max |x| ({bound_text(scale)}), about one ulp, so the floor is that ({bound_text(ulp)})"
    text += f"; atol = margin {margin:g} x {bound_text(floor)} = {bound_text(atol)}, rtol 0 ({len(items)} record measurements). Command: {command}"
    return CalibratedRule(match, phase, kinds, dtype, atol, text, len(items))


def amplifications(measurements: Sequence[Measurement]) -> tuple[Amplification, ...]:
    out: list[Amplification] = []
    for m in measurements:
        if m.skipped:
            continue
        order: dict[str, int] = {}
        errors: dict[tuple[str, str], tuple[float, float]] = {}
        for i, n in enumerate(m.noise):
            order.setdefault(n.name, i)
            key = (n.name, n.kind)
            old = errors.get(key, (0.0, 0.0))
            errors[key] = (max(old[0], n.max_abs), max(old[1], n.rel_l2))
        for direction, ins, outs in (
            ("forward", FORWARD_IN, FORWARD_OUT),
            ("backward", BACKWARD_IN, BACKWARD_OUT),
        ):
            for name in sorted(order, key=order.__getitem__):
                i_err = _worst(errors, name, ins)
                o_err = _worst(errors, name, outs)
                if i_err is None or o_err is None:
                    continue
                ratio = o_err[0] / i_err[0] if i_err[0] > 0 else None
                rel = o_err[1] / i_err[1] if i_err[1] > 0 else None
                out.append(
                    Amplification(m.case, m.perturbation, name, direction, i_err[0], o_err[0], ratio, rel)
                )
    return tuple(out)


def _worst(
    errors: dict[tuple[str, str], tuple[float, float]], name: str, kinds: Iterable[str]
) -> tuple[float, float] | None:
    found = [errors[(name, k)] for k in kinds if (name, k) in errors]
    if not found:
        return None
    return max(f[0] for f in found), max(f[1] for f in found)


def amplification_lines(rows: Sequence[Amplification]) -> list[str]:
    """A plain-text table, one row per module, direction and perturbation."""
    header = ("module", "direction", "perturbation", "input err", "output err", "out/in", "rel out/rel in")
    body = [
        (
            r.module,
            r.direction,
            r.perturbation,
            f"{r.input_error:.3g}",
            f"{r.output_error:.3g}",
            f"{r.ratio:.3g}" if r.ratio is not None else "n/a (input exact)",
            f"{r.rel_ratio:.3g}" if r.rel_ratio is not None else "n/a",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *body)
    ]


def render_table(
    rules: Sequence[CalibratedRule],
    measurements: Sequence[Measurement],
    margin: float,
    command: str,
    sidecar: str,
) -> str:
    lines = [
        "# Tolerance table calibrated by pytest-precalign: each bound is margin x the noise floor",
        "# measured by running each case's baseline against perturbed copies of itself (same weights).",
        f"# Command: {command}",
        f"# Margin: {margin:g}. Amplification (output error / input error per layer) and the per-record",
        f"# noise: {sidecar}",
        "# Perturbations:",
    ]
    for m in measurements:
        state = f"skipped: {m.skipped}" if m.skipped else f"{len(m.noise)} records measured"
        lines.append(f"#   {m.case}: {m.perturbation} ({m.description}): {state}")
    lines.append("rules:")
    for r in rules:
        fields = [f"match: {json.dumps(r.match)}", f"phase: {r.phase}"]
        if r.kinds:
            fields.append(f"kind: [{', '.join(r.kinds)}]")
        fields += [f"dtype: {r.dtype}", f"atol: {bound_text(r.atol)}", "rtol: 0", f"why: {json.dumps(r.why)}"]
        lines.append("  - {" + ", ".join(fields) + "}")
    return "\n".join(lines) + "\n"


def sidecar_data(
    rules: Sequence[CalibratedRule],
    measurements: Sequence[Measurement],
    amps: Sequence[Amplification],
    margin: float,
    command: str,
) -> dict[str, Any]:
    return {
        "tool": "pytest-precalign calibrate",
        "command": command,
        "margin": margin,
        "perturbations": [
            {
                "case": m.case,
                "name": m.perturbation,
                "description": m.description,
                "skipped": m.skipped or None,
                "records": len(m.noise),
                "unpaired": m.unpaired,
            }
            for m in measurements
        ],
        "rules": len(rules),
        "amplification": [
            {
                "case": a.case,
                "perturbation": a.perturbation,
                "module": a.module,
                "direction": a.direction,
                "input_error": a.input_error,
                "output_error": a.output_error,
                "ratio": a.ratio,
                "rel_ratio": a.rel_ratio,
            }
            for a in amps
        ],
        "noise": [
            {
                "case": m.case,
                "perturbation": m.perturbation,
                "name": n.name,
                "kind": n.kind,
                "slot": n.slot,
                "phase": n.phase,
                "step": n.step,
                "dtype": n.dtype,
                "max_abs": n.max_abs,
                "scale": n.scale,
                "rel_l2": n.rel_l2,
            }
            for m in measurements
            for n in m.noise
        ],
    }


def sidecar_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}.calibration.json")


def check_writable(out: Path, force: bool) -> None:
    """Refuse, before any model runs, to replace existing files without ``--force``."""
    for path in (out, sidecar_path(out)):
        if path.is_dir():
            raise ConfigError(f"--out: {path} is a directory, expected a YAML file path")
        if path.exists() and not force:
            raise ConfigError(f"--out: {path} already exists; refusing to overwrite it (pass --force)")
    if not out.parent.is_dir():
        raise ConfigError(f"--out: folder {out.parent} does not exist")


def parse_margin(text: str) -> float:
    try:
        margin = float(text)
    except ValueError:
        margin = float("nan")
    if not (math.isfinite(margin) and margin >= 1):
        raise ConfigError(
            f"--margin: expected a number >= 1 (the factor over the measured noise floor), got {text!r}"
        )
    return margin


def run_calibration(
    config_path: Path,
    case_names: Sequence[str],
    out: Path,
    margin_text: str,
    perturbations_text: str,
    force: bool,
    command: str,
) -> list[str]:
    """The ``precalign calibrate`` command: check everything, measure, write; the lines to print."""
    from ..config.loader import load_config_file
    from ..run.devices import check_devices

    margin = parse_margin(margin_text)
    config = load_config_file(config_path)
    for case in config.cases:  # before torch is imported: torch_npu without CANN stops it
        if not case_names or case.name in case_names:
            check_devices(config, case)
    from .measure import calibration_cases, measure_case, parse_perturbations

    perturbations = parse_perturbations(perturbations_text)
    cases = calibration_cases(config, case_names)
    check_writable(out, force)
    measurements: list[Measurement] = []
    for case in cases:
        measurements += measure_case(config, case, perturbations)
    if all(m.skipped for m in measurements):
        reasons = "; ".join(f"{m.perturbation}: {m.skipped}" for m in measurements)
        raise ConfigError(f"--perturbations: nothing was measured ({reasons})")
    rules = build_rules(measurements, margin, command)
    amps = amplifications(measurements)
    side = sidecar_path(out)
    # The command as typed (paths, case names) is written into both files: no secret in it.
    text = redacted_text(render_table(rules, measurements, margin, command, side.name))
    data = redacted(sidecar_data(rules, measurements, amps, margin, command))
    for path, content in ((side, json.dumps(data, indent=1, allow_nan=False) + "\n"), (out, text)):
        try:
            write_file_atomic(path, content, replace=force)
        except TargetExists:
            raise ConfigError(
                f"--out: {path} already exists; refusing to overwrite it (pass --force)"
            ) from None
    lines = [
        f"{m.case}: {m.perturbation}: "
        + (f"skipped ({m.skipped})" if m.skipped else f"{len(m.noise)} records, {m.description}")
        for m in measurements
    ]
    lines.append("Error amplification per layer (output error / input error):")
    lines += ["  " + line for line in amplification_lines(amps)]
    lines.append(f"wrote {out} ({len(rules)} rules, margin {margin:g}) and {side}")
    return lines
