"""A phase verdict's run notes in words (the verdict holds the notes:
``verdict.phase_notes``): a replicated record the ranks of a merged side disagreed on, a step an
interrupted run left partial, as the terminal and report.json say them."""

from __future__ import annotations

from ..trace.note_blocks import ReplicaMismatch
from ..verdict.phase import PartialStep


def replica_mismatch_text(m: ReplicaMismatch) -> str:
    """``o_proj.weight (param, step 0): rank1 recorded other values than rank0 (...)``."""
    return f"{m.name} ({m.kind}, step {m.step}): {', '.join(m.differ)} recorded other values than {m.kept} ({m.detail})"


def partial_step_text(p: PartialStep) -> str:
    """``<what is missing>: step 3 not compared (steps 0, 1, 2 compared)``."""
    steps = ", ".join(str(s) for s in p.compared)
    return f"{p.note.detail}: step {p.note.step} not compared (steps {steps} compared)"
