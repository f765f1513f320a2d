"""Messages for stored baselines: what was written, what the environment and weights changed,
how to accept new values. Never prints."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..reports.text import PhaseReport, failure_message
from .store import BaselineOutcome


def recorded_with(manifest: Mapping[str, Any]) -> str:
    versions = manifest.get("versions") or {}
    parts = [
        f"{k} {versions[k]}" for k in ("torch", "transformers", "megatron-core", "python") if versions.get(k)
    ]
    parts.append(f"{manifest.get('device', '?')} {manifest.get('dtype', '?')}")
    written = (manifest.get("baseline") or {}).get("written_at")
    return ", ".join(parts) + (f", written {written}" if written else "")


def written_message(outcome: BaselineOutcome, accept: str) -> str:
    if outcome.action == "written-earlier":
        return (
            f"Baseline of case {outcome.case!r} was written earlier in this run (by another xdist "
            f"worker): {outcome.path}\nRerun to compare against it."
        )
    return "\n".join(
        [
            f"Baseline written: {outcome.path} (there was none for case {outcome.case!r}; candidate "
            f"weights {outcome.weights_source}).",
            *recovery_lines(outcome),
            "The test fails so that no baseline is ever accepted silently: check it in, then rerun to "
            "compare against it.",
        ]
    )


def recovery_lines(outcome: BaselineOutcome) -> list[str]:
    return (
        [f"Cleaned up after an interrupted write: {'; '.join(outcome.recovered)}"]
        if outcome.recovered
        else []
    )


def context_lines(outcome: BaselineOutcome) -> list[str]:
    lines = [f"Stored baseline: {outcome.path} (recorded with {recorded_with(outcome.stored_env)})"]
    if outcome.variants > 1:
        which = f"variant {outcome.variant!r}" if outcome.variant else "the default variant"
        lines.append(f"Baseline variant: {which}, the closest of {outcome.variants} to this environment")
    lines.extend(recovery_lines(outcome))
    if outcome.env_diff:
        lines.append("Environment changed since it was recorded: " + "; ".join(outcome.env_diff))
    else:
        lines.append("Environment: the same versions, device, dtype and determinism as the baseline's")
    if outcome.weights_diff:
        lines.append(
            "Weights differ from the baseline's (" + "; ".join(outcome.weights_diff) + "): differences "
            "below may come from different weights, not from numeric drift. Store the weights with the "
            "baseline (precalign record saves weights.safetensors) or give the model its old ones."
        )
    else:
        lines.append(f"Weights: the same as the baseline's (checksum matches; {outcome.weights_source})")
    return lines


def mismatch_message(outcome: BaselineOutcome, report: PhaseReport, accept: str) -> str:
    lines = context_lines(outcome)
    lines.append(failure_message(report))
    if outcome.action == "updated":
        lines.append(
            f"Baseline rewritten (--align-update): {outcome.path}. The test still fails; rerun to check."
        )
    elif outcome.obtained is not None:
        lines.append(
            f"Obtained trace written to {outcome.obtained} "
            f"(precalign compare {outcome.path} {outcome.obtained})"
        )
        lines.append(f"To accept the new values: {accept}")
    elif outcome.obtained_skipped:
        lines.append(f"Obtained trace not written: {outcome.obtained_skipped}")
    return "\n".join(lines)


def updated_message(outcome: BaselineOutcome) -> str:
    """--align-update rewrote the case's baseline because another phase mismatched."""
    return (
        f"Baseline rewritten (--align-update): {outcome.path}, because a phase of case "
        f"{outcome.case!r} mismatched. The test still fails; rerun to check."
    )


def baseline_dict(outcome: BaselineOutcome) -> dict[str, Any]:
    return {
        "path": str(outcome.path),
        "action": outcome.action,
        "environment_changes": list(outcome.env_diff),
        "weights_changes": list(outcome.weights_diff),
        "obtained": str(outcome.obtained) if outcome.obtained else None,
        "variant": outcome.variant,
        "variants": outcome.variants,
    }


def accept_command(config_path: str | Path, root: str | Path, case: str) -> str:
    return f'pytest --align-config {config_path} --align-baseline {root} --align-update -k "{case}"'
