"""The manifest facts of a case, read once from its two traces (``case_facts``, at the start
of ``run.outcome.finish``): each side's run record (``trace.training_record.read_run_record``:
per-step scalars, settings and plan, initial parameters, frozen parameters), whether our
``Recorder`` recorded it, and the notes its recorder or merge wrote (steps whose parameter
grads were gone, ranks that disagreed on a replicated record, steps left incomplete by an
interrupted run). ``run.both_recorded`` and the verdict read these, never the manifests again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..parallel.layout import RECORDER_KEY
from ..trace.records import Trace
from ..trace.step_scalars import SCALARS_KEY
from ..trace.training_record import RunRecord, is_training_run, read_run_record

SIDES = ("baseline", "candidate")


@dataclass(frozen=True)
class SideFacts:
    """What one side's manifest says, as the verdict reads it."""

    side: str  # "baseline" or "candidate"
    run: RunRecord  # its training run's record (empty for a one-step case)
    own_scalars: bool  # its manifest holds per-step scalars (not only loss records)
    frozen: frozenset[str]  # the parameters its run froze
    steps: tuple[Any, ...]  # the steps it recorded (the manifest's ``steps``)
    incomplete_steps: tuple[Mapping[str, Any], ...]  # steps its interrupted run left partial
    grads_missing: tuple[Mapping[str, Any], ...]  # steps whose parameter grads were gone
    replica_mismatches: tuple[Mapping[str, Any], ...]  # replicated records its ranks disagreed on
    recorder: bool  # recorded by our ``Recorder`` or a callback (the manifest's ``RECORDER_KEY``)
    not_recordable: Mapping[str, str]  # record id -> why its grad could not be recorded
    dp_unpaired: Mapping[str, str]  # record id -> why its DP replicas were not joined on it
    tp_unmerged: Mapping[str, str]  # record id -> why its DTensor TP ranks were not merged on it


@dataclass(frozen=True)
class CaseFacts:
    """Both sides' facts and what the case's verdict takes from the baseline's manifest."""

    baseline: SideFacts
    candidate: SideFacts
    parents: Mapping[str, str]  # the baseline's module tree: module -> its parent
    dtype: str  # the runs' dtype (the table's rules by dtype)
    training_run: bool  # a training run (``trace.training_record.is_training_run``)
    # Both sides are runs our ``Recorder`` (or ``PrecalignCallback``) recorded with per-step
    # scalars, which may hold layers on some steps only (a case records the same on both).
    recorded_runs: bool

    @property
    def sides(self) -> tuple[SideFacts, SideFacts]:
        return self.baseline, self.candidate


def side_facts(trace: Trace, side: str) -> SideFacts:
    manifest = trace.manifest
    run = read_run_record(manifest)
    settings = run.settings
    return SideFacts(
        side=side,
        run=run,
        own_scalars=bool(manifest.get(SCALARS_KEY)),
        frozen=frozenset(settings.frozen or ()) if settings is not None else frozenset(),
        steps=tuple(manifest.get("steps", ())),
        incomplete_steps=tuple(manifest.get("incomplete_steps", ())),
        grads_missing=tuple(manifest.get("grads_missing", ())),
        replica_mismatches=tuple(manifest.get("replica_mismatches", ())),
        recorder=RECORDER_KEY in manifest,
        not_recordable=_texts(manifest.get("not_recordable")),
        dp_unpaired={
            rid: why
            for block in _blocks(manifest.get("dp_join"))
            for rid, why in _texts(block.get("unpaired")).items()
        },
        tp_unmerged=_texts(manifest.get("tp_unmerged")),
    )


def _texts(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def _blocks(value: Any) -> list[Mapping[str, Any]]:
    return [b for b in value.values() if isinstance(b, Mapping)] if isinstance(value, Mapping) else []


def case_facts(baseline: Trace, candidate: Trace) -> CaseFacts:
    """The facts of two traces of a case (the candidate's manifest its own)."""
    parents = baseline.manifest.get("parents") or {}
    sides = side_facts(baseline, "baseline"), side_facts(candidate, "candidate")
    return CaseFacts(
        baseline=sides[0],
        candidate=sides[1],
        parents={str(k): str(v) for k, v in parents.items()},
        dtype=str(baseline.manifest.get("dtype") or "float32"),
        training_run=is_training_run(baseline, candidate),
        recorded_runs=all(side.recorder and side.own_scalars for side in sides),
    )
