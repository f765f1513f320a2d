"""The words every stage uses, as ``Literal`` types with their allowed values, in one
torch-free place: phases, record kinds, pair status and evidence, record mode and level,
baseline actions. Compare against these names, never against string literals kept elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal, get_args

Phase = Literal["forward", "backward", "step"]
Kind = Literal["activation", "input", "grad_output", "grad_input", "param", "param_grad", "loss", "logits"]
# How a record pair came out: checked (ok / fail / shape mismatch), present on one side only, or
# present on both with evidence of kinds that cannot be compared (a checksum vs statistics).
Status = Literal["ok", "fail", "shape", "only_baseline", "only_candidate", "not_compared"]
# The best evidence both sides of a pair have: full tensors, statistics, a hash, or nothing.
Evidence = Literal["tensor", "stats", "hash", "none"]
Mode = Literal["stats", "tensor", "hash"]  # what the recorder keeps of each tensor
Level = Literal["module", "op", "mix"]  # what the recorder hooks: modules, torch ops, or both
UpdatePolicy = Literal["none", "mismatched", "all"]  # --align-update / --align-update-all
# What a stored-baseline check did: compared, wrote a missing baseline, rewrote a mismatched
# one (--align-update), rewrote it whatever it found (--align-update-all), or found it written
# by another xdist worker earlier in this run.
Action = Literal["compared", "written", "updated", "rewritten", "written-earlier"]

PHASES: Final[tuple[Phase, ...]] = get_args(Phase)
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
STATUSES: Final[tuple[Status, ...]] = get_args(Status)
EVIDENCE: Final[tuple[Evidence, ...]] = get_args(Evidence)
MODES: Final[tuple[Mode, ...]] = get_args(Mode)
LEVELS: Final[tuple[Level, ...]] = get_args(Level)
UPDATE_POLICIES: Final[tuple[UpdatePolicy, ...]] = get_args(UpdatePolicy)
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)

FORWARD_KINDS: Final[tuple[Kind, ...]] = ("input", "activation", "logits", "loss")
BACKWARD_KINDS: Final[tuple[Kind, ...]] = ("grad_output", "grad_input", "param_grad")
STEP_KINDS: Final[tuple[Kind, ...]] = ("param",)
PHASE_OF_KIND: Final[Mapping[Kind, Phase]] = {
    **dict.fromkeys(FORWARD_KINDS, "forward"),
    **dict.fromkeys(BACKWARD_KINDS, "backward"),
    **dict.fromkeys(STEP_KINDS, "step"),
}
# The kinds whose divergence fails a phase (module inputs are evidence for the origin, not gates).
OUTPUT_KINDS: Final[Mapping[Phase, tuple[Kind, ...]]] = {
    "forward": ("activation", "logits", "loss"),
    "backward": ("grad_output", "grad_input", "param_grad"),
    "step": ("param",),
}
CHECKED: Final[tuple[Status, ...]] = ("ok", "fail", "shape")
FAILED: Final[tuple[Status, ...]] = ("fail", "shape")


def as_kind(value: object) -> Kind:
    """``value`` as a record kind; ValueError naming the allowed kinds otherwise."""
    if value not in KINDS:
        raise ValueError(f"kind {value!r} is unknown (allowed: {', '.join(KINDS)})")
    return value


def as_phase(value: object) -> Phase:
    if value not in PHASES:
        raise ValueError(f"phase {value!r} is unknown (allowed: {', '.join(PHASES)})")
    return value


def phases_in_order(phases: Iterable[str]) -> tuple[Phase, ...]:
    """The phases to run, in execution order; "step" implies "backward" (the optimizer needs
    the grads). ValueError naming the allowed phases for an unknown one."""
    wanted = {as_phase(p) for p in phases}
    if "step" in wanted:
        wanted.add("backward")
    return tuple(p for p in PHASES if p in wanted)
