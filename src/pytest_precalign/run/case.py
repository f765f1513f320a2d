"""Run a case end to end: sources -> weight sync -> recorded runs -> mapping -> compare -> verdicts.

This is the only module that drives models. ``run_case`` returns a frozen ``CaseRun``;
``check_modules`` does the same for two modules a Python test built itself.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..compare.pairs import Comparison
from ..compare.tolerances import ToleranceTable, default_table
from ..config.specs import AlignConfig, CaseSpec, Dumps, Models, OptimizerSpec, RecordSpec, TrainingSpec
from ..errors import CaseError, PrecalignError, SourceError, foreign_error
from ..mapping.spec import MappingSpec
from ..mapping.weights import SyncReport, sync_weights
from ..recording import HookRecorder
from ..recording.determinism import deterministic, environment
from ..sources import LoadedModel, preflight
from ..sources.inputs import CaseInputs, check_inputs, check_token_ids
from ..verdict.replay_finding import NotReplayed
from ..vocabulary import phases_in_order
from .contract_check import contract_before_training
from .envelope_runs import baseline_envelope
from .isolation import isolate
from .live import case_where, live_case
from .outcome import CaseRun, FinishInputs, finish
from .side import run_side
from .step_replay import with_replay


def preflight_case(config: AlignConfig, case: CaseSpec) -> None:
    """Cheap checks that a case can run: its models build (on meta) and its inputs resolve;
    or its dumps load (their indexes; tensors are read when compared)."""
    if case.dumps is not None:
        from .stored_runs import load_side

        load_side(case.dumps.baseline)
        load_side(case.dumps.candidate)
        return
    for model_name in (case.models.baseline, case.models.candidate):
        spec = config.models[model_name]
        preflight(spec, config.base_dir)
        weights = spec.options.get("weights")
        if weights is not None:  # refused before anything runs, not when the case does
            from ..checkpoints.load_into import check_trusted

            what = f"models.{spec.name}.weights"
            check_trusted(Path(weights["load"]), weights["format"], what, trust=bool(weights.get("trust")))
    _same_attention_window(config, case)
    # The inputs resolve (a factory imports); they are built when the case runs: a seq_len of
    # 1e9 must not cost ``validate`` its memory.
    check_inputs(config.inputs[case.inputs], config.base_dir)


def _same_attention_window(config: AlignConfig, case: CaseSpec) -> None:
    """An HF model whose config sets a sliding attention window against a megatron preset
    (none builds one: every token attends to all earlier ones) is refused before comparing."""
    specs = (config.models[case.models.baseline], config.models[case.models.candidate])
    for spec, other in (specs, specs[::-1]):
        if spec.source != "hf" or other.source != "megatron":
            continue
        from ..sources.hf import sliding_window

        window = sliding_window(spec, config.base_dir)
        if window is not None:
            raise SourceError(
                f"{spec.where}: models.{spec.name}.config: sliding_window {window} (each token attends to "
                f"the last {window} only), but models.{other.name} (preset {other.options.get('preset')!r}) "
                "builds full causal attention: set sliding_window: null in its config, or compare it "
                "against a model with the same window"
            )


def run_case(config: AlignConfig, case: CaseSpec) -> CaseRun:
    """Run a case: its two models live, or its two stored runs (``dump:`` sides). An error
    that is not ours (the user's model raising, a full disk, out of memory) becomes one
    ``CaseError`` line naming the case and where it was raised; Ctrl-C stays Ctrl-C."""
    try:
        return _run_case(config, case)
    except PrecalignError:
        raise
    except Exception as exc:  # noqa: BLE001 - the contract: no traceback for foreign errors
        raise foreign_error(exc, f"{case_where(config, case)}the run") from exc


def _run_case(config: AlignConfig, case: CaseSpec) -> CaseRun:
    started = time.perf_counter()
    if case.dumps is not None:
        return _gate_dumps(config, case, started, case.dumps)
    base_spec, cand_spec = config.models[case.models.baseline], config.models[case.models.candidate]
    table = case_table(config, case)
    with live_case(config, case, base_spec, cand_spec) as live:
        # A tensor-parallel side is built here at TP=1 to receive the synced weights; its
        # ranks run in their own processes and load their shards of them.
        baseline, candidate, sync = live.build_synced(base_spec, cand_spec)
        assert live.inputs is not None
        for loaded, spec in ((baseline, base_spec), (candidate, cand_spec)):
            check_token_ids(live.inputs, loaded.module, spec.name, f"{live.where}inputs.{case.inputs}")
        env = live.environment(base_spec)
        sides = ((baseline, base_spec), (candidate, cand_spec))
        stopped = contract_before_training(case, sides, live.inputs, table, sync, env, started)
        if stopped is not None:  # the sides' plans differ: nothing is trained
            return stopped
        judge = step_judge(case, baseline.module, synced=sync is not None)
        base_trace = live.record(
            baseline, base_spec, live.manifest(base_spec, side="baseline", model=base_spec.name)
        )
        envelope = baseline_envelope(live, base_spec, case)
        isolated: list[Comparison] = []
        call_context = candidate.context

        def isolation(recorder: HookRecorder) -> None:
            isolated.append(
                isolate(recorder.calls, base_trace, recorder.trace(), case.mapping, table, call_context)
            )

        cand_trace = live.record(
            candidate,
            cand_spec,
            live.manifest(cand_spec, side="candidate", model=cand_spec.name),
            isolation if case.isolate else None,
            seed=base_spec.seed,
        )
    del baseline, candidate  # refcounting frees them; a full gc.collect() costs ~0.25 s a case
    run = finish(
        replace(
            FinishInputs.of_case(case, (base_trace, cand_trace), table, started),
            sync=sync,
            environment=env,
            isolated=isolated[0] if isolated else None,
            judge_steps=judge,
            envelope=envelope,
        )
    )
    return with_replay(config, case, run)  # a failing run's first divergent step drilled into


def step_judge(case: CaseSpec, baseline: torch.nn.Module, *, synced: bool) -> Any:
    """The judge of each optimizer step on its inputs (``update_check``), for a case with a
    step phase recorded in tensor mode: the baseline's parameters before step 0 are kept now
    (before it runs), the candidate's are the same when the weights were synced into it.
    None otherwise (parameters judged by the table)."""
    if "step" not in case.phases or case.record.mode != "tensor":
        return None
    from .update_check import snapshot, update_judge

    initial = snapshot(baseline)
    return update_judge(
        case.training.optimizer, {"baseline": initial, **({"candidate": initial} if synced else {})}
    )


def case_table(config: AlignConfig, case: CaseSpec) -> ToleranceTable:
    """The case's tolerance table (``tolerances:``), else torch.testing's defaults."""
    return config.tolerances[case.tolerances] if case.tolerances else default_table()


def _gate_dumps(config: AlignConfig, case: CaseSpec, started: float, dumps: Dumps) -> CaseRun:
    """A case over two stored runs (msprobe dumps or traces) made elsewhere: no models."""
    from .stored_runs import load_side

    base, cand = load_side(dumps.baseline), load_side(dumps.candidate)
    table = case_table(config, case)
    return finish(
        replace(FinishInputs.of_case(case, (base, cand), table, started), environment=dict(base.manifest))
    )


def check_modules(
    baseline: torch.nn.Module,
    candidate: torch.nn.Module,
    inputs: Mapping[str, Any],
    *,
    phases: tuple[str, ...] = ("forward",),
    labels: torch.Tensor | None = None,
    table: ToleranceTable | None = None,
    mapping: MappingSpec | None = None,
    sync_weights_first: bool = False,
    record: RecordSpec | None = None,
    steps: int = 1,
    optimizer: OptimizerSpec | None = None,
    name: str = "modules",
    seed: int = 0,
    train: bool | None = None,
) -> CaseRun:
    """Compare two modules a test built itself (the ``align_runner`` fixture uses this). They
    run in train mode when ``train`` (default: the mode they are in) and are left in the modes
    they had."""
    started = time.perf_counter()
    try:
        ordered = phases_in_order(phases)
    except ValueError as exc:
        raise CaseError(str(exc)) from None
    train = _mode_of(baseline, candidate, train, name)
    case = CaseSpec(
        name=name,
        sides=Models("baseline", "candidate"),
        inputs="inputs",
        phases=ordered,
        steps=steps,
        sync_weights=sync_weights_first,
        strict_weights=True,
        mapping=mapping,
        training=TrainingSpec(
            optimizer or OptimizerSpec(),
            loss="causal_lm" if labels is not None else ("none" if "backward" not in ordered else "mean"),
            train=train,
        ),
        record=record or RecordSpec(mode="tensor"),
        tolerances=None,
        expect=None,
        where=name,
    )
    sync = None
    if sync_weights_first:
        sync = sync_weights(baseline, candidate, mapping, strict=True)
    data = CaseInputs(dict(inputs), labels)
    return _run_modules(case, (baseline, candidate), data, table or default_table(), sync, seed, started)


def _run_modules(
    case: CaseSpec,
    modules: tuple[torch.nn.Module, torch.nn.Module],
    data: CaseInputs,
    table: ToleranceTable,
    sync: SyncReport | None,
    seed: int,
    started: float,
) -> CaseRun:
    """``check_modules``' two sides recorded, compared and judged."""
    judge = step_judge(case, modules[0], synced=sync is not None)
    with deterministic(True) as flags:
        env = environment("cpu", "float32", seed, flags)
        a, b = (
            run_side(LoadedModel(side, module, None), data, case, {**env, "side": side}, seed)
            for side, module in zip(("baseline", "candidate"), modules, strict=True)
        )
    why = "the modules were built by the test, and the tool cannot rebuild them as they were at step 0"
    return finish(
        replace(
            FinishInputs.of_case(case, (a, b), table, started),
            case=None,  # no expect: the test's own modules
            sync=sync,
            environment=env,
            judge_steps=judge,
            replay=NotReplayed(why),
        )
    )


def _mode_of(baseline: torch.nn.Module, candidate: torch.nn.Module, train: bool | None, name: str) -> bool:
    """The mode to run both in: ``train`` when given, else the one both models are in."""
    if train is not None:
        return train
    if baseline.training != candidate.training:
        raise CaseError(
            f"{name}: the baseline is in {'train' if baseline.training else 'eval'} mode and the "
            f"candidate in {'train' if candidate.training else 'eval'} mode; pass train=True or "
            "train=False to run both in one mode"
        )
    return baseline.training


__all__ = ["CaseRun", "SourceError", "check_modules", "preflight_case", "run_case"]
