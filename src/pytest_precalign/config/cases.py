"""One entry of the config's ``cases:`` list -> a frozen ``CaseSpec``. No torch, no pytest.

``config/loader.py`` parses the named sections (models, inputs, tolerances, mappings) first and
passes them in; every check that needs a case's models or inputs is made here, so a bad case
is reported with the config, at its line, not when it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..compare.moe_tokens import MoeSpec
from ..compare.tolerances import ToleranceTable
from ..mapping.layer_mapping import LayerMapping, read_layer_mapping
from ..mapping.spec import MappingSpec, parse_mapping, read_mapping_file
from ..specs.coverage import DEFAULT_MIN_COVERAGE
from ..specs.expectation import Expectation
from ..vocabulary import (
    KINDS,
    LEVELS,
    LOSSES,
    MODES,
    PHASES,
    RECORD_FORMAT_ALIASES,
    RECORD_FORMATS,
    TRAINING_CLASSES,
    Loss,
    Phase,
    RecordFormat,
    phases_in_order,
)
from ..yaml_reader import Reader
from .launch import launched
from .model_weights import loads_weights
from .presets import (
    PRESET_LAYER_MAPPINGS,
    PRESET_MAPPINGS,
    layer_mapping_path,
    mapping_variables,
    preset_mapping,
)
from .search import SearchSpec, parse_search
from .specs import CaseSpec, Dumps, InputSpec, Models, ModelSpec, RecordSpec, TrainingSpec
from .training import check_training, parse_envelope, parse_optimizer, parse_training

CASE_KEYS = (
    "name",
    "baseline",
    "candidate",
    "inputs",
    "phases",
    "steps",
    "weights",
    "mapping",
    "optimizer",
    "record",
    "tolerances",
    "expect",
    "loss",
    "train",
    "isolate",
    "layer_mapping",
    "search",
    "stored_layer_mapping",
    "min_coverage",
    "training",
    "envelope",
    "replay",
)

# Where a named mapping came from: (file, None) or (None, (value, source, key_path, line)).
MappingSource = tuple[Any, Any]


def parse_case(
    reader: Reader,
    models: Mapping[str, ModelSpec],
    inputs: Mapping[str, InputSpec],
    tables: Mapping[str, ToleranceTable],
    mappings: Mapping[str, MappingSource],
    base_dir: Path,
) -> CaseSpec:
    reader.check_keys(CASE_KEYS)
    name = reader.get_str("name", required=True)
    _check_case_name(reader, name)
    refs, dumps = _sides(reader, models, base_dir)
    input_name = reader.get_str("inputs", required=not dumps) or ""
    if not dumps and input_name not in inputs:
        known = ", ".join(inputs) or "none defined under 'inputs'"
        reader.fail(f"unknown inputs {input_name!r} (known: {known})", "inputs")
    phases = _phases(reader)
    steps = reader.get_int("steps", 1, minimum=1)
    sync, strict = _weights(reader)
    sides = None if dumps else (models[refs["baseline"]], models[refs["candidate"]])
    _check_loaded_not_synced(reader, sync, sides)
    mapping = _case_mapping(reader, sides, mappings, base_dir)
    mapping = _with_layer_mapping(reader, mapping, base_dir)
    optimizer, training = parse_optimizer(reader), parse_training(reader, *(sides or (None, None)))
    record = _record(reader, base_dir)
    table = _table(reader, tables)
    loss = _loss(reader, phases, None if dumps else inputs[input_name])
    check_training(reader, optimizer, training, steps, None if dumps else inputs[input_name])
    _check_record_level(reader, record, refs, models)
    case = CaseSpec(
        name=name,
        sides=_case_sides(refs, dumps),
        inputs=input_name,
        phases=phases,
        steps=steps,
        sync_weights=sync,
        strict_weights=strict,
        mapping=mapping,
        training=TrainingSpec(
            optimizer,
            loss,
            reader.get_bool("train", False),
            training,
            parse_envelope(reader, phases, steps, bool(dumps)),
            reader.get_bool("replay", True),
        ),
        record=record,
        tolerances=table,
        expect=_expect(reader, phases, None if dumps else steps),
        isolate=_isolate(reader, record, models.get(refs["candidate"])),
        where=reader.where(),
        search=_search(
            reader, inputs.get(input_name), models.get(refs["candidate"]), models.get(refs["baseline"])
        ),
        baseline_rename=_baseline_rename(reader, base_dir),
        min_coverage=min_coverage(reader),
    )
    reader.done()
    return case


def _case_sides(refs: Mapping[str, str], dumps: Mapping[str, Path]) -> Models | Dumps:
    """The case's two models, or its two stored runs (named ``dump:<path as given>``)."""
    if dumps:
        return Dumps(dumps["baseline"], dumps["candidate"], (refs["baseline"], refs["candidate"]))
    return Models(refs["baseline"], refs["candidate"])


def _table(reader: Reader, tables: Mapping[str, ToleranceTable]) -> str | None:
    table: str | None = reader.get_str("tolerances")
    if table is not None and table not in tables:
        known = ", ".join(tables) or "none defined under 'tolerances'"
        reader.fail(f"unknown tolerance table {table!r} (known: {known})", "tolerances")
    return table


def min_coverage(reader: Reader) -> float:
    """``min_coverage``: the share (0..1) of the baseline's output records of each phase that
    must find a partner on the candidate's side."""
    value = reader.get_float("min_coverage", DEFAULT_MIN_COVERAGE)
    if not 0.0 <= value <= 1.0:
        reader.fail(
            f"expected a share between 0 and 1 (e.g. 0.5: half the baseline's output records "
            f"paired), got {value}",
            "min_coverage",
        )
    return float(value)


def _sides(
    reader: Reader, models: Mapping[str, ModelSpec], base_dir: Path
) -> tuple[dict[str, str], dict[str, Path]]:
    """``baseline``/``candidate``: model names, or ``{dump: path}`` (both, or neither)."""
    refs: dict[str, str] = {}
    dumps: dict[str, Path] = {}
    for key in ("baseline", "candidate"):
        value = reader.require(key)
        if isinstance(value, dict):  # {dump: path}: a stored run instead of a model
            sub = reader.child(key, value, reader.line_of(key))
            sub.check_keys(("dump",))
            given = sub.get_str("dump", required=True)
            sub.done()
            path = (base_dir / given).resolve()
            if not path.exists():
                sub.fail(f"no such dump or trace directory: {path}", "dump")
            dumps[key], refs[key] = path, f"dump:{given}"
            continue
        ref = reader.get_str(key, required=True)
        if ref not in models:
            reader.fail(
                f"unknown model {ref!r} (known: {', '.join(models) or 'none'}; or {{dump: path}})", key
            )
        refs[key] = ref
    if len(dumps) == 1:
        reader.fail("baseline and candidate must both be models or both be {dump: path}", next(iter(dumps)))
    return refs, dumps


def _phases(reader: Reader) -> tuple[Phase, ...]:
    phases_value = reader.raw("phases", ["forward"])
    if isinstance(phases_value, str):
        phases_value = [phases_value]
    if not isinstance(phases_value, list) or not phases_value:
        reader.fail(f"expected a non-empty list of phases ({', '.join(PHASES)})", "phases")
    for phase in phases_value:
        if phase not in PHASES:
            reader.fail(f"unknown phase {phase!r} (allowed: {', '.join(PHASES)})", "phases")
    if len(set(phases_value)) != len(phases_value):
        reader.fail("phases are listed twice", "phases")
    return phases_in_order(phases_value)  # optimizer steps need grads: backward is run (and compared) too


def _weights(reader: Reader) -> tuple[bool, bool]:
    """``weights: {sync, strict}``."""
    weights = reader.get_mapping("weights")
    if weights is None:
        return True, True
    weights.check_keys(("sync", "strict"))
    sync = weights.get_bool("sync", True)
    strict = weights.get_bool("strict", True)
    weights.done()
    return sync, strict


def _check_loaded_not_synced(reader: Reader, sync: bool, sides: tuple[ModelSpec, ModelSpec] | None) -> None:
    """A candidate that loads its checkpoint (``models.X.weights.load``) is not overwritten by
    the weight sync: the case must say ``weights: {sync: false}``."""
    if sync and sides is not None and loads_weights(sides[1].options):
        reader.fail(
            f"candidate {sides[1].name!r} loads its weights from {sides[1].options['weights']['load']}, "
            "which the weight sync would overwrite: set weights: {sync: false}",
            "weights",
        )


def _case_mapping(
    reader: Reader,
    sides: tuple[ModelSpec, ModelSpec] | None,
    mappings: Mapping[str, MappingSource],
    base_dir: Path,
) -> MappingSpec | None:
    """``mapping:`` a named mapping, ``preset:NAME`` or a YAML file, instantiated with the
    case's models' $variables (``sides`` is None for a case of stored dumps)."""
    mapping_ref = reader.get_str("mapping")
    if mapping_ref is None:
        return None
    variables = {} if sides is None else mapping_variables(*sides)
    if mapping_ref in mappings:
        path, inline = mappings[mapping_ref]
        if path is not None:
            return read_mapping_file(path, mapping_ref, variables)
        value, source, key_path, line = inline
        return parse_mapping(mapping_ref, Reader(value, source, key_path, line), variables)
    if mapping_ref.startswith("preset:"):
        if sides is None:
            reader.fail(
                "a preset mapping reads the models' configs: it needs models, not {dump: path}", "mapping"
            )
        return preset_mapping(reader, mapping_ref, variables, *sides)
    if mapping_ref.endswith((".yaml", ".yml")):
        return read_mapping_file(
            check_file(reader, "mapping", base_dir / mapping_ref), mapping_ref, variables
        )
    known = ", ".join([*mappings, *(f"preset:{p}" for p in PRESET_MAPPINGS)])
    reader.fail(f"unknown mapping {mapping_ref!r} (known: {known}; or a .yaml file)", "mapping")


def _with_layer_mapping(reader: Reader, mapping: MappingSpec | None, base_dir: Path) -> MappingSpec | None:
    """``layer_mapping:`` (msprobe's format) added to the case's mapping, or as its only rules."""
    layer_ref = reader.get_str("layer_mapping")
    if layer_ref is None:
        return mapping
    layers = _layer_mapping(reader, layer_ref, base_dir)
    return replace(mapping, layer_mapping=layers) if mapping else MappingSpec(layer_ref, layer_mapping=layers)


def _baseline_rename(reader: Reader, base_dir: Path) -> MappingSpec | None:
    rename_ref = reader.get_str("stored_layer_mapping")
    if rename_ref is None:
        return None
    return MappingSpec(
        rename_ref, layer_mapping=_layer_mapping(reader, rename_ref, base_dir, "stored_layer_mapping")
    )


def _record(reader: Reader, base_dir: Path) -> RecordSpec:
    rec = reader.get_mapping("record")
    if rec is None:
        return RecordSpec()
    rec.check_keys(("mode", "inputs", "include", "exclude", "format", "level", "moe", "golden"))
    record = RecordSpec(
        mode=rec.get_choice("mode", MODES, "stats"),
        inputs=rec.get_bool("inputs", True),
        include=_str_tuple(rec, "include"),
        exclude=_str_tuple(rec, "exclude"),
        format=_record_format(rec),
        level=rec.get_choice("level", LEVELS, "module"),
        moe=_moe(rec),
        golden=_golden(rec, base_dir),
    )
    if record.golden is not None and record.mode == "tensor":
        rec.fail(
            "golden keeps full tensors only where they are beyond tolerance: use mode stats or hash", "golden"
        )
    rec.done()
    return record


def _golden(rec: Reader, base_dir: Path) -> Path | None:
    """``golden: PATH``: a golden run's trace folder, Recorder root or msprobe dump."""
    given = rec.get_str("golden")
    if given is None:
        return None
    path: Path = (base_dir / str(given)).resolve()
    if not path.exists():
        rec.fail(f"no such golden run (a trace folder, Recorder root or msprobe dump): {path}", "golden")
    return path


def _moe(rec: Reader) -> MoeSpec | None:
    moe = rec.get_mapping("moe")
    if moe is None:
        return None
    moe.check_keys(("block", "experts"))
    spec = MoeSpec(block=moe.get_str("block", required=True), experts=moe.get_str("experts", "experts.*"))
    moe.done()
    if rec.get_choice("mode", MODES, "stats") != "tensor":
        rec.fail("needs mode: tensor (expert rows are matched to tokens by their values)", "moe")
    return spec


def _expect(reader: Reader, phases: tuple[Phase, ...], steps: int | None) -> Expectation | None:
    """``expect:``; ``steps``: the case's (None for stored runs, whose steps are the recordings')."""
    exp = reader.get_mapping("expect")
    if exp is None:
        return None
    exp.check_keys(("phase", "first_divergence", "origin", "kind", "step", "diverged"))
    if exp.raw("diverged") == "contract":
        exp.fail(
            "'contract' names the check before step 0, not a class: a settings difference it finds "
            "is diverged: settings",
            "diverged",
        )
    diverged = exp.get_choice("diverged", TRAINING_CLASSES, None)
    step = exp.get_int("step", None, minimum=0)
    if step is not None and steps is not None and step >= steps:
        exp.fail(f"step {step} is beyond the case's steps ({steps}: steps 0..{steps - 1})", "step")
    if (step is None) != (diverged is None):
        exp.fail(
            "a training run's expectation needs both step and diverged",
            "diverged" if step is not None else "step",
        )
    phase = exp.get_choice("phase", PHASES, phases[0])
    if phase not in phases:
        exp.fail(f"phase {phase!r} is not among the case's phases ({', '.join(phases)})", "phase")
    origin = exp.raw("origin")
    if origin is not None and not isinstance(origin, (bool, str) if diverged else bool):
        exp.fail(f"expected true or false, got {origin!r}", "origin")
    expect = Expectation(
        phase=phase,
        first_divergence=exp.get_str("first_divergence", required=diverged is None) or "",
        origin=origin if not isinstance(origin, str) else None,
        kind=exp.get_choice("kind", KINDS),
        where=exp.where(),
        step=step,
        diverged=diverged,
        run_origin=origin if isinstance(origin, str) else None,
    )
    exp.done()
    return expect


def _loss(reader: Reader, phases: tuple[Phase, ...], spec: InputSpec | None) -> Loss:
    """``loss:``, checked against the phases and inputs (``spec`` is None for stored dumps)."""
    loss = reader.get_choice("loss", LOSSES, "causal_lm")
    if loss == "causal_lm" and spec is not None and spec.labels and _token_count(spec) == 1:
        # The causal-LM loss predicts token t+1 from token t: one token leaves nothing to
        # predict, a NaN loss on both sides -- which would compare as "aligned".
        reader.fail(
            f"loss 'causal_lm' needs at least 2 tokens per row, and inputs.{spec.name} has 1 (it "
            "would be NaN on both sides): make the sequence longer, or choose loss: mean or loss: model",
            "loss" if reader.has("loss") else "inputs",
        )
    if "backward" in phases and spec is not None:
        # What run_side would reject only when the case runs: report it with the config.
        if loss == "none":
            reader.fail("phase 'backward' needs a loss (allowed here: causal_lm, model, mean)", "loss")
        if loss == "causal_lm" and spec.kind in ("tokens", "ids", "dataset") and not spec.labels:
            reader.fail(
                f"phase 'backward' with loss 'causal_lm' needs labels: set 'labels: true' in "
                f"inputs.{spec.name}, or choose loss: mean or loss: model",
                "loss" if reader.has("loss") else "phases",
            )
    return loss


def _token_count(spec: InputSpec) -> int | None:
    """Tokens per row of token inputs (None for an input factory's)."""
    if spec.kind == "tokens":
        return spec.seq_len
    if spec.kind == "dataset" and spec.path is not None:
        return spec.seq_len  # every row read has the first row's length
    if spec.kind in ("ids", "dataset") and spec.input_ids:
        return min(len(row) for row in spec.input_ids)
    return None


def _check_record_level(
    reader: Reader, record: RecordSpec, refs: Mapping[str, str], models: Mapping[str, ModelSpec]
) -> None:
    for side in ("baseline", "candidate"):
        model_spec = models.get(refs[side])
        if record.level != "module" and model_spec is not None and launched(model_spec.options):
            reader.fail(
                f"record level {record.level!r} is not supported with tensor_parallel > 1 "
                f"(model {refs[side]!r}); use level module",
                "record",
            )


def _isolate(reader: Reader, record: RecordSpec, candidate: ModelSpec | None) -> bool:
    isolate = reader.get_bool("isolate", False)
    if isolate and candidate is None:
        reader.fail("isolation re-runs the candidate's modules: it needs a model, not a dump", "isolate")
    assert candidate is not None or not isolate
    if isolate and candidate is not None and launched(candidate.options):
        reader.fail(
            "isolation calls the candidate's modules in this process: not with tensor_parallel > 1 "
            "(nor pipeline_parallel > 1 or launch)",
            "isolate",
        )
    if isolate and record.mode != "tensor":
        reader.fail(
            f"isolation re-runs modules on the baseline's tensors: it needs record: {{mode: tensor}} (got {record.mode!r})",
            "isolate",
        )
    if isolate and record.moe is not None:
        reader.fail(
            "isolation re-runs experts on rows in the baseline's order: not with record: {moe: ...}",
            "isolate",
        )
    if isolate and (not record.inputs or record.level == "op"):
        reader.fail(
            "isolation needs the modules' inputs: record: {inputs: true} at level module or mix", "isolate"
        )
    return isolate


def _search(reader: Reader, spec: InputSpec | None, *models: ModelSpec | None) -> SearchSpec | None:
    sub = reader.get_mapping("search")
    if sub is None:
        return None
    if spec is None or any(m is None for m in models):
        reader.fail("the search generates inputs for models: it needs models, not {dump: path}", "search")
    if any(m is not None and launched(m.options) for m in models):
        reader.fail(
            "the search runs both models in this process: not with tensor_parallel > 1 "
            "(nor pipeline_parallel > 1 or launch)",
            "search",
        )
    vocab = spec.vocab_size if spec.kind == "tokens" else None
    return parse_search(sub, vocab, spec.labels, spec.attention_mask or spec.mask is not None)


def _layer_mapping(reader: Reader, ref: str, base_dir: Path, key: str = "layer_mapping") -> LayerMapping:
    path = layer_mapping_path(ref, base_dir)
    if path is None:
        allowed = ", ".join(f"preset:{p}" for p in PRESET_LAYER_MAPPINGS)
        reader.fail(f"unknown preset {ref!r} (allowed: {allowed}; or a .yaml file)", key)
    if not path.is_file():
        reader.fail(f"file not found: {path}", key)
    return read_layer_mapping(path)


def _str_tuple(reader: Reader, key: str) -> tuple[str, ...]:
    value = reader.raw(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        reader.fail("expected a glob or a list of globs", key)
    return tuple(value)


def check_file(reader: Reader, key: str, file: Path) -> Path:
    """A file a config key refers to: a missing one is reported at that key."""
    file = file.resolve()
    if not file.is_file():
        what = "is a directory, expected a YAML file" if file.is_dir() else "file not found"
        reader.fail(f"{what}: {file}", key)
    return file


def _check_case_name(reader: Reader, name: str) -> None:
    if not _safe_case_name(name):
        reader.fail(
            f"{name!r} is not a usable case name: it names the case's baseline folder, so it must be one "
            "path component of at most 200 characters, not starting with '.', without '[', ']', ':', "
            "'/', '\\', '@' (a variant's folder is <case>@<label>), spaces or control characters",
            "name",
        )


def _safe_case_name(name: str) -> bool:
    """A case name is a test id part and a folder name in a baseline DIR (``DIR/<name>``,
    ``DIR/.<name>.lock``): ``.``, ``..`` or ``a/b`` would reach other folders, and ``c@x`` is
    the folder of case ``c``'s variant ``x`` (``baseline/variants.py``)."""
    return (
        0 < len(name) <= 200
        and not name.startswith(".")
        and not any(c in name for c in "[]:/\\@ ")
        and all(c.isprintable() for c in name)
    )


def _record_format(rec: Reader) -> RecordFormat:
    """``record.format``: native or msprobe (``precalign``, its older name, reads as native)."""
    raw = rec.raw("format")
    alias = RECORD_FORMAT_ALIASES.get(raw) if isinstance(raw, str) else None
    if alias is not None:
        return alias
    allowed = (*RECORD_FORMATS, *RECORD_FORMAT_ALIASES)
    value = rec.get_choice("format", allowed, "native")
    return "msprobe" if value == "msprobe" else "native"
