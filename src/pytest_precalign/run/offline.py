"""Offline compare of two stored runs (``precalign compare``): load each side, map, compare,
and give verdicts for every phase the baseline recorded. No models are built."""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..compare.tolerances import ToleranceTable, load_table
from ..config.presets import PRESET_LAYER_MAPPINGS, layer_mapping_path, manifest_variables, resolve_preset
from ..errors import ConfigError, TraceError
from ..mapping.layer_mapping import read_layer_mapping
from ..mapping.spec import MappingSpec, read_mapping_file
from ..mapping.usage import check_applied
from ..mapping.wrapper_prefix import prefix_mapping, prefix_note, wrapper_prefix
from ..parallel.layout import ParallelLayout, parallel_rank_folders
from ..reports.outcome import ItemOutcome, phase_outcome
from ..reports.text import PhaseReport
from ..trace.records import Trace, is_training_run
from ..trace.training_record import INITIAL_PARAMS_KEY
from ..verdict.replay_finding import NotReplayed
from ..vocabulary import PHASES, Phase
from .outcome import CaseRun, FinishInputs, finish
from .stored_runs import load_side, load_sides

# The item of a run recorded as per-step scalars only (no layer records on the baseline side).
RUN_PHASE: Phase = "step"


def load_tolerances(value: str | None) -> ToleranceTable:
    """``--tolerances FILE`` (``compare.tolerances.load_table``)."""
    return load_table(None if value is None else Path(value), "--tolerances", Path.cwd())


def load_mapping(
    value: str | None, variables: Mapping[str, Any], *, megatron_baseline: bool = False
) -> MappingSpec | None:
    """``--mapping``: ``preset:NAME`` (``config.presets.resolve_preset``) or a mapping YAML."""
    if value is None:
        return None
    if value.startswith("preset:"):
        return resolve_preset(value, variables, "--mapping", megatron_baseline=megatron_baseline)
    file = Path(value)
    if not file.is_file():
        raise ConfigError(f"--mapping: {value}: file not found (expected a mapping YAML or preset:NAME)")
    return read_mapping_file(file, value, variables)


def _shown(keys: set[tuple[int, int]], at_most: int = 8) -> str:
    """The first ``at_most`` (step, rank) keys in order, and how many more."""
    ordered = sorted(keys)
    text = ", ".join(f"step{s}/rank{r}" for s, r in ordered[:at_most]) or "none"
    return text + (f" and {len(ordered) - at_most} more" if len(ordered) > at_most else "")


@dataclass(frozen=True, kw_only=True)
class OfflineOptions:
    """How ``precalign compare`` compares two stored runs (its options, as given)."""

    tolerances: str | None = None  # --tolerances FILE (None: the default table)
    mapping: str | None = None  # --mapping: a mapping YAML or preset:NAME
    variables: Mapping[str, Any] | None = None  # --var: the mapping's $variables
    layer_mapping: str | None = None  # --layer-mapping: a YAML file or preset:NAME
    fuzzy_match: bool = False  # --fuzzy-match: API calls paired by fuzzy names
    progress: Callable[[int, int], None] | None = None  # (pairs done, pairs) while comparing
    metrics: Sequence[str] = ()  # --metric module:function, custom metrics
    min_coverage: float | None = None  # --min-coverage (None: the default floor)


def compare_run_sets(
    baseline: str | Path,
    candidate: str | Path,
    parallel: Mapping[str, ParallelLayout] | None = None,
    options: OfflineOptions = OfflineOptions(),  # noqa: B008 (frozen: shared safely)
) -> list[tuple[tuple[int, int], CaseRun]]:
    """Pair every (step, rank) of both sides; a clear error when they hold different ones.
    A multi-rank side that is merged (see ``load_side``) makes one pair of the two sides."""
    parallel = parallel or {}
    if any(
        parallel.get(side) is not None or parallel_rank_folders(path) is not None
        for side, path in (("baseline", baseline), ("candidate", candidate))
    ):
        return [((0, 0), compare_runs(baseline, candidate, options, parallel=parallel))]
    _same_level(baseline, candidate)
    base_keys, cand_keys = load_sides(baseline), load_sides(candidate)
    if len(base_keys) == 1 and len(cand_keys) == 1:
        (key, base), (cand,) = next(iter(base_keys.items())), cand_keys.values()
        return [(key, compare_runs(baseline, candidate, options, loaded=(base, cand)))]
    if set(base_keys) != set(cand_keys):
        raise TraceError(
            f"the sides hold different steps/ranks ({len(base_keys)} in baseline {baseline}, "
            f"{len(cand_keys)} in candidate {candidate}): not in candidate: "
            f"{_shown(set(base_keys) - set(cand_keys))}; "
            f"not in baseline: {_shown(set(cand_keys) - set(base_keys))}"
        )
    out = []
    for key in sorted(base_keys):
        pair = (base_keys[key].manifest["path"], cand_keys[key].manifest["path"])
        loaded = (base_keys[key], cand_keys[key])
        out.append((key, compare_runs(*pair, options, check_mapping=False, loaded=loaded)))
    # The mapping's rules must apply somewhere in the run, not on each step and rank.
    uses = [run.mapping_use for _, run in out if run.mapping_use is not None]
    if uses:
        check_applied(functools.reduce(operator.or_, uses))
    return out


def _with_layer_mapping(spec: MappingSpec | None, layer_mapping: str | None) -> MappingSpec | None:
    """The mapping with ``--layer-mapping``'s layers added (a YAML file or ``preset:NAME``)."""
    if layer_mapping is None:
        return spec
    path = layer_mapping_path(layer_mapping, Path.cwd())
    if path is None or not path.is_file():
        allowed = ", ".join(f"preset:{p}" for p in PRESET_LAYER_MAPPINGS)
        raise ConfigError(f"--layer-mapping: {layer_mapping}: not found (a YAML file, or one of {allowed})")
    layers = read_layer_mapping(path)
    return replace(spec, layer_mapping=layers) if spec else MappingSpec(layer_mapping, layer_mapping=layers)


def _same_level(baseline: str | Path, candidate: str | Path) -> None:
    """Both sides must be the same kind of msprobe folder: a dump root on one side and a step
    or rank folder on the other pairs the wrong things (msprobe compare takes step folders)."""
    from ..msprobe.layout import LEVEL_NAMES, dump_level

    levels = dump_level(baseline), dump_level(candidate)
    if None in levels or levels[0] == levels[1]:
        return
    raise TraceError(
        f"the sides are different kinds of msprobe folder: baseline {baseline} is "
        f"{LEVEL_NAMES[str(levels[0])]}, candidate {candidate} is {LEVEL_NAMES[str(levels[1])]}; "
        "give both at the same level: two rank folders (one pair), two step folders (every "
        "rank), or two dump roots (every step and rank)"
    )


def _wrapper_mapping(base: Trace, cand: Trace) -> tuple[MappingSpec | None, tuple[str, ...]]:
    """Without ``--mapping``: a constant wrapper prefix between the sides' names, taken off
    (``mapping.wrapper_prefix``), with the line that says so."""
    names = [
        {r.name for r in side.records if r.module_class != "api"} | set(_initial_params(side.manifest))
        for side in (base, cand)
    ]
    found = wrapper_prefix(*names)
    if found is None:
        return None, ()
    side, prefix = found
    manifest = (base if side == "baseline" else cand).manifest
    training = manifest.get("training")
    trainer = training.get("trainer") if isinstance(training, Mapping) else None
    other = names[1] if side == "baseline" else names[0]
    return prefix_mapping(side, prefix, other), (prefix_note(side, prefix, trainer),)


def _initial_params(manifest: Mapping[str, Any]) -> list[str]:
    """The parameter names of a run's initial parameters (a scalars-only recording's names)."""
    found = manifest.get(INITIAL_PARAMS_KEY)
    return [str(name) for name in found] if isinstance(found, Mapping) else []


def _read_sides(
    baseline: str | Path, candidate: str | Path, layouts: Mapping[str, ParallelLayout]
) -> tuple[Trace, Trace]:
    return load_side(baseline, layouts.get("baseline")), load_side(candidate, layouts.get("candidate"))


def compare_runs(
    baseline: str | Path,
    candidate: str | Path,
    options: OfflineOptions = OfflineOptions(),  # noqa: B008 (frozen: shared safely)
    *,
    parallel: Mapping[str, ParallelLayout] | None = None,
    check_mapping: bool = True,
    loaded: tuple[Trace, Trace] | None = None,
) -> CaseRun:
    """``loaded``: the two sides, already read from ``baseline`` and ``candidate`` (by
    ``compare_run_sets``, which reads them to pair their steps and ranks)."""
    import time

    started = time.perf_counter()
    base, cand = loaded or _read_sides(baseline, candidate, parallel or {})
    if options.fuzzy_match:
        from ..mapping.fuzzy_api_calls import fuzzy_api_calls

        base, cand = fuzzy_api_calls(base), fuzzy_api_calls(cand)
    table = load_tolerances(options.tolerances)
    # A mapping's $variables: the runs' own model configs, then --var (which wins).
    known = {**manifest_variables(base.manifest, cand.manifest), **(options.variables or {})}
    spec = _with_layer_mapping(load_mapping(options.mapping, known), options.layer_mapping)
    notes: tuple[str, ...] = ()
    if spec is None:
        spec, notes = _wrapper_mapping(base, cand)
    phases = tuple(p for p in PHASES if any(r.phase == p for r in base.records))
    if not phases and is_training_run(base, cand):
        phases = (RUN_PHASE,)  # per-step scalars only: the run's verdict is the step item's
    if not phases:
        raise TraceError(f"{baseline}: the baseline side has no records")
    custom = [load_metric(m) for m in options.metrics]
    job = FinishInputs(
        name=f"{Path(baseline).name}_vs_{Path(candidate).name}",
        phases=phases,
        baseline=base,
        candidate=cand,
        table=table,
        started=started,
        mapping=spec,
        environment=dict(base.manifest),
        progress=options.progress,
        workers=_merged_compare_workers(base, cand),
        check_mapping=check_mapping,
        min_coverage=options.min_coverage,
        replay=NotReplayed("the runs are recordings, not models to train"),
    )
    run = replace(finish(job), notes=notes)
    if custom:
        run = replace(run, custom_metrics=custom_metric_values(run, custom))
    return run


def compare_outcomes(
    baseline: str | Path, candidate: str | Path, runs: Sequence[tuple[tuple[int, int], CaseRun]]
) -> list[ItemOutcome]:
    """Each compared (step, rank) pair's phases as item outcomes (``precalign compare``)."""
    out = []
    for (step, rank), run in runs:
        for phase in run.phases:
            report = PhaseReport.of_run(
                run,
                phase,
                defined_in=str(baseline),
                baseline=str(baseline),
                candidate=str(candidate),
                reproduce=f"precalign compare {baseline} {candidate}",
                case=run.name if len(runs) == 1 else f"{run.name}@step{step}_rank{rank}",
            )
            extra: dict[str, Any] = {"step": step, "rank": rank}
            custom = custom_metric_entries(run, phase)
            if custom:
                extra["custom_metrics"] = custom
            out.append(phase_outcome(report, extra))
    return out


def custom_metric_entries(run: CaseRun, phase: str) -> list[dict[str, Any]]:
    """The report entries of a phase's custom metric values (``--metric``)."""
    return [
        {"name": r.name, "kind": r.kind, "slot": r.slot, "step": r.step, "values": run.custom_metrics[r.id]}
        for r in run.baseline.records
        if r.phase == phase and r.id in run.custom_metrics
    ]


def load_metric(spec: str) -> tuple[str, Callable[[Any, Any], float]]:
    """``file.py:function`` (msit's custom algorithm plug-in): f(baseline, candidate) -> float."""
    import importlib.util

    file, sep, func = spec.rpartition(":")
    path = Path(file)
    if not sep or not file.endswith(".py") or not func.isidentifier():
        raise ConfigError(f"--metric: expected file.py:function, got {spec!r}")
    if not path.is_file():
        raise ConfigError(f"--metric: {file}: file not found")
    module_spec = importlib.util.spec_from_file_location(f"precalign_metric_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"--metric: {file}: cannot be loaded as Python")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"--metric: {file}: importing it raised {type(exc).__name__}: {exc}") from None
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ConfigError(f"--metric: {file} has no function {func!r}")
    return func, fn


def custom_metric_values(
    run: CaseRun, metrics: Sequence[tuple[str, Callable[[Any, Any], float]]]
) -> dict[str, dict[str, float]]:
    """Per compared tensor pair (by record id): each custom metric's value."""
    out: dict[str, dict[str, float]] = {}
    for pair in run.comparison.pairs:
        if pair.evidence != "tensor" or pair.candidate is None:
            continue
        baseline, candidate = run.baseline.tensor(pair.record), run.candidate.tensor(pair.candidate)
        values = {}
        for name, fn in metrics:
            try:
                values[name] = float(fn(baseline, candidate))
            except Exception as exc:
                raise ConfigError(
                    f"--metric {name}: raised {type(exc).__name__} on {pair.record.id}: {exc}"
                ) from None
        out[pair.record.id] = values
    return out


def _merged_compare_workers(*sides: Trace) -> int | None:
    """A merged multi-rank side builds each merged tensor when it is compared: one compare
    thread keeps memory at one merged pair (``PRECALIGN_COMPARE_THREADS``, when set, wins)."""
    if "PRECALIGN_COMPARE_THREADS" in os.environ or not any("parallel_merge" in s.manifest for s in sides):
        return None
    return 1
