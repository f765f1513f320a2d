"""The contract check before step 0: what each side WILL do, from its own trainer's plan
made before anything trains, judged directly by ``verdict.case_verdict.judge_stopped`` (the
one predicate ``verdict.training_settings.judge_plans``, which the run verdict also judges at
step 0). A difference stops the case there: nothing is trained or recorded, and the run
verdict says ``first_divergent: settings`` with the first differing step, the parameter
group and both values.

Each side's plan is its case trainer's own ``plan`` (``run.trainers``), the settings the
trainer writes into the side's manifest while training, made from the side's built model, so
a user's patch of its optimizer or scheduler classes shows in it. A launched side (torchrun) is planned in
this process from its TP=1 twin: a ``megatron`` side with the same megatron-core functions
and spec (its ranks unite their stages' groups into the same parameter names); a launched
side stepping with ``torch.optim`` has no plan (its ranks write none), so nothing is checked
before training for it.
"""

from __future__ import annotations

import fnmatch
import functools
import time
from collections.abc import Mapping
from typing import Any

from ..compare.tolerances import ToleranceTable
from ..config.specs import CaseSpec, ModelSpec
from ..errors import CaseError
from ..mapping.spec import baseline_param_names
from ..mapping.weights import SyncReport
from ..sources import LoadedModel
from ..sources.inputs import CaseInputs
from ..trace.records import Trace
from ..trace.training_record import RunRecord, TrainingSettings
from ..verdict.case_verdict import judge_stopped
from .outcome import CaseRun
from .trainers import case_trainer, side_trainer


def planned_training(
    model: LoadedModel, spec: ModelSpec, data: CaseInputs, case: CaseSpec, side: str
) -> TrainingSettings | None:
    """The settings (arguments and plan) this side's trainer will write, made before it
    trains (None: a side without a plan of its own, see the module doc)."""
    return case_trainer(side_trainer(case, side)).plan(model, spec, data, case, spec.seed)


def contract_before_training(
    case: CaseSpec,
    sides: tuple[tuple[LoadedModel, ModelSpec], tuple[LoadedModel, ModelSpec]],
    data: CaseInputs,
    table: ToleranceTable,
    sync: SyncReport | None,
    environment: Mapping[str, Any],
    started: float,
) -> CaseRun | None:
    """The case stopped before step 0 when the two sides' plans differ (None: they agree, or
    the case trains no step, or a side has no plan)."""
    if "step" not in case.phases or "backward" not in case.phases:
        return None
    _check_no_decay(case, sides)
    plans = []
    for side, (model, spec) in zip(("baseline", "candidate"), sides, strict=True):
        plans.append(planned_training(model, spec, data, case, side))
    base, cand = plans
    if base is None or cand is None or base.plan is None or cand.plan is None:
        return None
    rename = functools.partial(baseline_param_names, case.mapping)
    verdicts = judge_stopped(case.phases, (base, cand), table, case.expect, rename, case.min_coverage)
    if verdicts is None:
        return None  # the plans agree: the case trains
    # What each side holds: its settings; nothing was trained or recorded.
    traces = [
        Trace({**environment, "side": side, "model": spec.name}, ()).with_run(RunRecord(settings))
        for side, (_, spec), settings in zip(("baseline", "candidate"), sides, (base, cand), strict=True)
    ]
    return CaseRun(
        name=case.name,
        phases=case.phases,
        comparison=verdicts.comparison,
        verdicts=verdicts.phases,
        baseline=traces[0],
        candidate=traces[1],
        sync=sync,
        seconds=time.perf_counter() - started,
        table=table.name,
        environment=dict(environment),
        training=verdicts.training,
        stopped=True,
    )


def _check_no_decay(
    case: CaseSpec, sides: tuple[tuple[LoadedModel, ModelSpec], tuple[LoadedModel, ModelSpec]]
) -> None:
    """A ``no_decay`` glob that matches no parameter of either side is an error: it would
    silently leave decayed what it was written to exempt (fail closed, as a mapping rule that
    matches nothing)."""
    globs = case.training.optimizer.no_decay or ()
    names = [name for model, _ in sides for name, _ in model.module.named_parameters()]
    dead = [glob for glob in globs if not any(fnmatch.fnmatchcase(name, glob) for name in names)]
    if dead:
        sample = ", ".join(names[:3])
        raise CaseError(
            f"case {case.name!r}: optimizer.no_decay: {dead[0]!r} matches no parameter of either "
            f"side (their names look like {sample}, ...); each glob must exempt at least one "
            "parameter from weight decay"
        )
