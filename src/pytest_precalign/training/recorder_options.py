"""The ``Recorder``'s arguments, checked when it is made (one ``ConfigError`` each, naming the
argument and what is allowed), and the note a manifest gets when a step's grads were gone."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..recording.param_records import PARAM_GRADS
from ..trace.note_blocks import MissingGrads
from ..vocabulary import LEVELS, RECORD_FORMAT_ALIASES, RECORD_FORMATS, RECORDING_MODES
from .golden import GoldenError

FORMATS = (*RECORD_FORMATS, *RECORD_FORMAT_ALIASES)  # precalign: the older name of native


def selection(values: Iterable[int] | None, what: str) -> frozenset[int] | None:
    if values is None:
        return None
    if isinstance(values, int):
        values = [values]
    chosen = frozenset(values)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in chosen):
        raise ConfigError(f"Recorder: {what}= must be integers >= 0, got {sorted(chosen, key=str)!r}")
    return chosen


def golden_path(golden: str | Path | None, mode: str) -> Path | None:
    if golden is None:
        return None
    if mode == "tensor":
        raise ConfigError("Recorder: golden= keeps tensors only where needed: use mode stats or hash")
    if not Path(golden).exists():
        raise GoldenError(f"Recorder: golden {golden}: no such file or directory")
    return Path(golden)


def tuples(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if k in ("lr", "weight_decay") and v is not None else v for k, v in fields.items()}


def check_choices(**given: str) -> None:
    """The constructor's word-valued arguments, each one of its allowed values."""
    allowed = {"mode": RECORDING_MODES, "level": LEVELS, "format": FORMATS, "param_grads": PARAM_GRADS}
    for key, value in given.items():
        if value not in allowed[key]:
            raise ConfigError(f"Recorder: unknown {key} {value!r} (allowed: {', '.join(allowed[key])})")


def checked_queue_bytes(value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"Recorder: queue_bytes= must be an integer >= 1, got {value!r}")
    return value


def grads_missing_note(step: int, rank: int, names: Sequence[str]) -> MissingGrads:
    """The manifest's note of a step whose parameter grads were all gone at ``stop()``."""
    return MissingGrads(
        step=step,
        rank=rank,
        count=len(names),
        names=tuple(names[:5]),
        why=(
            'Recorder(param_grads="step") found no parameter grad at stop() and grads_ready() was '
            "not called: call rec.grads_ready() after the backward, before the loop zeroes the grads"
        ),
    )
