"""Run a case end to end: sources -> weight sync -> recorded runs -> mapping -> compare -> verdicts.

This is the only module that drives models. ``run_case`` returns a frozen ``CaseRun``;
``check_modules`` does the same for two modules a Python test built itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..compare.pairs import Comparison
from ..compare.tolerances import ToleranceTable, default_table
from ..config.specs import AlignConfig, CaseSpec, ModelSpec, OptimizerSpec, RecordSpec
from ..errors import CaseError, PrecalignError, SourceError
from ..mapping.spec import MappingSpec
from ..mapping.weights import SyncReport, sync_weights
from ..recording.determinism import deterministic, environment
from ..recording.recorder import Recorder
from ..sources import LoadedModel, build_model, preflight, runtime
from ..sources.inputs import CaseInputs, build_inputs, check_token_ids
from ..trace.records import Trace
from ..vocabulary import phases_in_order
from .isolation import isolate
from .outcome import CaseRun, finish
from .side import run_side


def preflight_case(config: AlignConfig, case: CaseSpec) -> None:
    """Cheap checks that a case can run: its models build (on meta) and its inputs resolve;
    or its dumps load (their indexes; tensors are read when compared)."""
    if case.baseline_dump is not None and case.candidate_dump is not None:
        from .stored_runs import load_side

        load_side(case.baseline_dump)
        load_side(case.candidate_dump)
        return
    for model_name in (case.baseline, case.candidate):
        preflight(config.models[model_name], config.base_dir)
    build_inputs(config.inputs[case.inputs], config.base_dir)


def build_synced(
    config: AlignConfig, case: CaseSpec, base_spec: ModelSpec, cand_spec: ModelSpec
) -> tuple[LoadedModel, LoadedModel, SyncReport | None]:
    """Both models of a case, the baseline's weights synced into the candidate when the case
    asks for it (inside the caller's runtime and determinism contexts)."""
    where = f"{config.path}: case {case.name!r}: "
    baseline = build_model(base_spec, config.base_dir)
    candidate = build_model(cand_spec, config.base_dir)
    sync = None
    if case.sync_weights:
        sync = sync_weights(
            baseline.module, candidate.module, case.mapping, strict=case.strict_weights, context=lambda: where
        )
    return baseline, candidate, sync


def run_case(config: AlignConfig, case: CaseSpec) -> CaseRun:
    started = time.perf_counter()
    if case.baseline_dump is not None and case.candidate_dump is not None:
        return _gate_dumps(config, case, started)
    where = f"{config.path}: case {case.name!r}: "
    base_spec, cand_spec = config.models[case.baseline], config.models[case.candidate]
    inputs = build_inputs(config.inputs[case.inputs], config.base_dir)
    table = config.tolerances[case.tolerances] if case.tolerances else default_table()
    with ExitStack() as stack:
        flags = stack.enter_context(deterministic(config.defaults.deterministic))
        for spec in (base_spec, cand_spec):
            stack.enter_context(runtime(_in_process(spec)))
        # A tensor-parallel side is built here at TP=1 to receive the synced weights; its
        # ranks run in their own processes and load their shards of them.
        baseline, candidate, sync = build_synced(config, case, _in_process(base_spec), _in_process(cand_spec))
        for loaded, spec in ((baseline, base_spec), (candidate, cand_spec)):
            check_token_ids(inputs, loaded.module, spec.name, f"{where}inputs.{case.inputs}")
        env = environment(base_spec.device, base_spec.dtype, base_spec.seed, flags)
        manifest = {**env, "config_digest": config.digest, "case": case.name}
        base_trace = _run_any(
            baseline,
            base_spec,
            config,
            case,
            inputs,
            {**manifest, "side": "baseline", "model": base_spec.name},
        )
        isolated: list[Comparison] = []
        call_context = candidate.context

        def isolation(recorder: Recorder) -> None:
            isolated.append(
                isolate(recorder.calls, base_trace, recorder.trace(), case.mapping, table, call_context)
            )

        cand_trace = _run_any(
            candidate,
            cand_spec,
            config,
            case,
            inputs,
            {**manifest, "side": "candidate", "model": cand_spec.name},
            isolation if case.isolate else None,
            seed=base_spec.seed,
        )
    del baseline, candidate  # refcounting frees them; a full gc.collect() costs ~0.25 s a case
    return finish(
        case.name,
        case.phases,
        base_trace,
        cand_trace,
        case.mapping,
        table,
        case,
        sync,
        started,
        env,
        isolated[0] if isolated else None,
    )


def _gate_dumps(config: AlignConfig, case: CaseSpec, started: float) -> CaseRun:
    """A case over two stored runs (msprobe dumps or traces) made elsewhere: no models."""
    from .stored_runs import load_side

    assert case.baseline_dump is not None and case.candidate_dump is not None
    base, cand = load_side(case.baseline_dump), load_side(case.candidate_dump)
    table = config.tolerances[case.tolerances] if case.tolerances else default_table()
    return finish(
        case.name, case.phases, base, cand, case.mapping, table, case, None, started, dict(base.manifest)
    )


def _tensor_parallel(spec: ModelSpec) -> int:
    if spec.source != "megatron":
        return 1
    from ..sources.megatron import tensor_parallel

    return tensor_parallel(spec)


def _in_process(spec: ModelSpec) -> ModelSpec:
    """The TP=1 twin of a tensor-parallel model, built in this process."""
    if _tensor_parallel(spec) == 1:
        return spec
    return replace(spec, options={**spec.options, "tensor_parallel": 1})


def _run_any(
    model: LoadedModel,
    spec: ModelSpec,
    config: AlignConfig,
    case: CaseSpec,
    inputs: CaseInputs,
    manifest: Mapping[str, Any],
    after_first_forward: Callable[[Recorder], None] | None = None,
    *,
    seed: int | None = None,
) -> Trace:
    seed = spec.seed if seed is None else seed
    if _tensor_parallel(spec) == 1:
        return run_side(model, inputs, case, manifest, seed, after_first_forward)
    from .tensor_parallel import run_megatron_tensor_parallel

    full = {n: p.detach() for n, p in model.module.named_parameters()}
    return run_megatron_tensor_parallel(spec, config.base_dir, case, inputs, full, manifest, seed)


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
) -> CaseRun:
    """Compare two modules a test built itself (the ``align_runner`` fixture uses this)."""
    started = time.perf_counter()
    try:
        ordered = phases_in_order(phases)
    except ValueError as exc:
        raise CaseError(str(exc)) from None
    case = CaseSpec(
        name=name,
        baseline="baseline",
        candidate="candidate",
        inputs="inputs",
        phases=ordered,
        steps=steps,
        sync_weights=sync_weights_first,
        strict_weights=True,
        mapping=mapping,
        optimizer=optimizer or OptimizerSpec(),
        record=record or RecordSpec(mode="tensor"),
        tolerances=None,
        expect=None,
        loss="causal_lm" if labels is not None else ("none" if "backward" not in ordered else "mean"),
        train=False,
        where=name,
    )
    sync = None
    if sync_weights_first:
        sync = sync_weights(baseline, candidate, mapping, strict=True)
    data = CaseInputs(dict(inputs), labels)
    with deterministic(True) as flags:
        env = environment("cpu", "float32", seed, flags)
        a = run_side(LoadedModel("baseline", baseline, None), data, case, {**env, "side": "baseline"}, seed)
        b = run_side(
            LoadedModel("candidate", candidate, None), data, case, {**env, "side": "candidate"}, seed
        )
    return finish(name, ordered, a, b, mapping, table or default_table(), None, sync, started, env)


def describe_source_error(exc: PrecalignError, config_path: Path) -> str:
    text = str(exc)
    return text if str(config_path) in text else f"{config_path}: {text}"


__all__ = ["CaseRun", "SourceError", "check_modules", "preflight_case", "run_case"]
