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
# The best evidence both sides of a pair have: full tensors, statistics, statistics of which one
# side's were merged from the parts of a tensor the other side fuses (``trace/merged_stats``),
# a hash, or nothing.
Evidence = Literal["tensor", "stats", "merged_stats", "hash", "none"]
# The evidence compared as statistics (max/min/mean/norm), not element by element.
STATS_EVIDENCE: Final[tuple[Evidence, ...]] = ("stats", "merged_stats")
Mode = Literal["stats", "tensor", "hash"]  # what the recorder keeps of each tensor
# What a ``Recorder`` (or a case trainer's step sink, ``steps.step_sink``) keeps: a ``Mode``, or
# "scalars" (per-step scalars only: no layer and no model output is recorded).
RecordingMode = Literal["stats", "tensor", "hash", "scalars"]
Level = Literal["module", "op", "mix"]  # what the recorder hooks: modules, torch ops, or both
# How recorded runs are written: our trace format, or msprobe's dump layout. ``precalign``, the
# config's older name for ``native``, is still read as ``native`` (``RECORD_FORMAT_ALIASES``).
RecordFormat = Literal["native", "msprobe"]
UpdatePolicy = Literal["none", "mismatched", "all"]  # --align-update / --align-update-all
# What a stored-baseline check did: compared, wrote a missing baseline, rewrote a mismatched
# one (--align-update), rewrote it whatever it found (--align-update-all), or found it written
# by another xdist worker earlier in this run.
Action = Literal["compared", "written", "updated", "rewritten", "written-earlier"]
# What diverged first in a training run, in the order a step executes: the initial parameters,
# the settings (what the two sides' plans say, found by the contract check before step 0 and
# named at the step they first apply, or a step split into other micro-batches), the step's
# batch, the forward, the loss, the backward, the reduction of grads (ranks, micro-batches),
# clipping, the LR / weight decay as applied, the optimizer's update. ``contract`` names only the
# check before step 0 (``run.contract_check``, ``verdict.training_contract``), never a class.
TrainingClass = Literal[
    "weights",
    "settings",
    "data",
    "forward",
    "loss",
    "backward",
    # The scalars alone cannot tell: the grad norm moved past its tolerance and the loss moved
    # too, within its own (a per-step-scalars-only recording has no layer to say which).
    "forward_or_backward",
    "grad_reduction",
    "clipping",
    "schedule",
    "optimizer_update",
]
# How a training run's steps were judged: bitwise (a same-stack rerun) or under the tolerance table.
Lane = Literal["exact", "approximate", "envelope"]
# A case's ``loss:``: the causal-LM loss from the labels, the model's own output loss, the mean
# of the output, or none (a forward-only case).
Loss = Literal["causal_lm", "model", "mean", "none"]

PHASES: Final[tuple[Phase, ...]] = get_args(Phase)
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
MODES: Final[tuple[Mode, ...]] = get_args(Mode)
RECORDING_MODES: Final[tuple[RecordingMode, ...]] = get_args(RecordingMode)
LEVELS: Final[tuple[Level, ...]] = get_args(Level)
RECORD_FORMATS: Final[tuple[RecordFormat, ...]] = get_args(RecordFormat)
RECORD_FORMAT_ALIASES: Final[Mapping[str, RecordFormat]] = {"precalign": "native"}
UPDATE_POLICIES: Final[tuple[UpdatePolicy, ...]] = get_args(UpdatePolicy)
TRAINING_CLASSES: Final[tuple[TrainingClass, ...]] = get_args(TrainingClass)
LOSSES: Final[tuple[Loss, ...]] = get_args(Loss)

FORWARD_KINDS: Final[tuple[Kind, ...]] = ("input", "activation", "logits", "loss")
BACKWARD_KINDS: Final[tuple[Kind, ...]] = ("grad_output", "grad_input", "param_grad")
STEP_KINDS: Final[tuple[Kind, ...]] = ("param",)
PHASE_OF_KIND: Final[Mapping[Kind, Phase]] = {
    **dict.fromkeys(FORWARD_KINDS, "forward"),
    **dict.fromkeys(BACKWARD_KINDS, "backward"),
    **dict.fromkeys(STEP_KINDS, "step"),
}
# The model's own outputs (not a module's), recorded by ``Recorder.record_output``.
MODEL_OUTPUT_KINDS: Final[tuple[Kind, ...]] = ("loss", "logits")
# What a module hook records of a module.
MODULE_KINDS: Final[tuple[Kind, ...]] = ("activation", "input", "grad_output", "grad_input")
# Phase -> its place in execution order.
PHASE_INDEX: Final[Mapping[Phase, int]] = {p: i for i, p in enumerate(PHASES)}
# The kinds whose divergence fails a phase (module inputs are evidence for the origin, not gates).
GATE_KINDS: Final[Mapping[Phase, tuple[Kind, ...]]] = {
    "forward": ("activation", "logits", "loss"),
    "backward": ("grad_output", "grad_input", "param_grad"),
    "step": ("param",),
}
# The update check: a parameter after an optimizer step against the case's optimizer
# recomputing the step on that side's own inputs (``run/update_check``); failing, it names the
# optimizer step.
OPTIMIZER_UPDATE: Final = "optimizer_update"
CHECKED: Final[tuple[Status, ...]] = ("ok", "fail", "shape")
FAILED: Final[tuple[Status, ...]] = ("fail", "shape")


def as_kind(value: object) -> Kind:
    """``value`` as a record kind; ValueError naming the allowed kinds otherwise."""
    if value not in KINDS:
        raise ValueError(f"kind {value!r} is unknown (allowed: {', '.join(KINDS)})")
    return value


def as_recording_mode(value: object) -> RecordingMode:
    """``value`` as a recording mode; ValueError naming the allowed modes otherwise."""
    if value not in RECORDING_MODES:
        raise ValueError(f"mode {value!r} is unknown (allowed: {', '.join(RECORDING_MODES)})")
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
