"""Where a callback's run recorded its steps, kept in the training checkpoint, so that a run
resumed from it into a new root (a cluster job relaunched into a new output folder) points to
its first part (``Recorder.seek(step, continues=...)``, ``trace.run_parts``) and compares as one
run with it. Shared by the callbacks: ``PrecalignCallback`` (transformers' stateful callbacks,
``trainer_state.json``), ``PrecalignLightningCallback`` (the callback's ``state_dict`` in the
Lightning checkpoint)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..trace.run_ids import RUN_ID_KEY
from .recorder import Recorder
from .run_root import this_ranks_steps

PART_KEY = "precalign_run"  # the checkpoint's entry: {"root": the root's absolute path, "run_id"}


def run_part(recorder: Recorder, known: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a checkpoint saved now keeps of the run's recording (``known``: what the checkpoint
    it resumed from kept, while this run has recorded nothing yet)."""
    run_id = recorder._run.get(RUN_ID_KEY)
    if not isinstance(run_id, str):
        return dict(known) if known else None
    return {"root": os.path.abspath(recorder.root), "run_id": run_id}


def stored_root(part: Any) -> str | None:
    """The root a checkpoint's entry names, or None (no entry, or not one of ours)."""
    if isinstance(part, Mapping) and isinstance(part.get("root"), str) and part["root"]:
        return str(part["root"])
    return None


def continue_recording(
    recorder: Recorder, step: int, stored: str | None, given: str | Path | None, who: str
) -> None:
    """A run resumed at ``step``: continue the recording from the root the checkpoint names
    (``stored``) or the one the user gave (``given``, which wins), when it is not the
    recorder's own root; say so when neither tells where a new root's earlier steps are."""
    first = given if given is not None else stored
    own = os.path.realpath(recorder.root)
    if first is not None and os.path.realpath(first) != own:
        recorder.seek(step, continues=first)
        return
    if any(s < step for s in this_ranks_steps(recorder.root, recorder.rank)):
        return  # resumed into its own root: the run continues there
    warnings.warn(
        f"{who}: the run resumed at step {step} into {recorder.root}, and its checkpoint does not say "
        f"where its steps before {step} were recorded (saved without {who}, or by a release that "
        f"does not keep callback state): {recorder.root} compares as a run of its own from step "
        f"{step}; give {who}(..., continues=FIRST_ROOT) to join it with its first part",
        RuntimeWarning,
        stacklevel=3,
    )


def json_args(**given: Any) -> dict[str, Any]:
    """A callback's arguments as JSON (a ``Path`` as text, ``steps`` as a list); those that
    cannot be are left out (the stateful-callback restore of transformers rebuilds the callback
    from these)."""
    import json

    out: dict[str, Any] = {}
    for key, value in given.items():
        if isinstance(value, Path):
            value = str(value)
        elif key == "steps" and value is not None and not isinstance(value, (str, bytes, Mapping)):
            try:
                value = sorted(value)
            except TypeError:
                continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out
