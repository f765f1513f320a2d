"""What a phase was checked against instead of alignment, in words (the verdict holds the fact:
``verdict.phase_checks``), as the terminal, report.json and the HTML say it."""

from __future__ import annotations

from ..verdict.phase_checks import NotGated, PhaseCheck

_NOT_GATED = {
    "by_run": "judged by the run's expected divergence (records not gated)",
    "downstream": "downstream of the expected divergence (not gated)",
    "by_scalars": "no {phase} records on either side: judged by the run's per-step scalars",
}


def expectation_text(check: PhaseCheck) -> str:
    """``found the expected first divergence 'mlp' (origin: true)``, ``expected ... , found ...``."""
    if isinstance(check, NotGated):
        return _NOT_GATED[check.why].format(phase=check.phase)
    expect = check.expect
    wanted = f"first divergence {expect.first_divergence!r}"
    if expect.origin is not None:
        wanted += f" (origin: {str(expect.origin).lower()})"
    if expect.kind is not None:
        wanted += f" of kind {expect.kind}"
    if check.found is None:
        return f"expected {wanted} ({expect.where}), but the phase is aligned"
    if check.met:
        return f"found the expected {wanted}"
    name, origin, kind = check.found
    return f"expected {wanted} ({expect.where}), found {name!r} (origin: {str(origin).lower()}, kind {kind})"
