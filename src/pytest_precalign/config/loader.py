"""Alignment config: YAML text -> frozen ``AlignConfig``. No torch, no pytest.

Errors are ``ConfigError`` with one message naming the file, the line, the key path and
what is allowed (see ``yamlio.Reader``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..compare.tolerances import ToleranceTable, parse_table
from ..errors import ConfigError
from ..mapping.layer_mapping import LayerMapping, read_layer_mapping
from ..mapping.spec import MappingSpec, parse_mapping, read_mapping_file, reverse
from ..verdict.expectation import Expectation
from ..vocabulary import LEVELS, MODES, PHASES, Phase, phases_in_order
from ..yaml_reader import LineList, Reader, describe, load_yaml
from .launch import launched, parse_parallel
from .model_sources import COMMON_MODEL_KEYS, SOURCES
from .presets import PRESETS_DIR, QWEN2_FIELDS
from .search import IDS_KEYS, SearchSpec, parse_ids, parse_search

DEVICES = ("cpu", "cuda", "npu")
DTYPES = ("float32", "float16", "bfloat16", "float64")
OPTIMIZERS = ("adamw", "adam", "sgd")
LOSSES = ("causal_lm", "model", "mean", "none")
INPUT_KINDS = ("tokens", "factory", "ids")
TOP_LEVEL_KEYS = ("version", "defaults", "models", "inputs", "tolerances", "mappings", "cases")
DEFAULTS_KEYS = ("device", "dtype", "seed", "deterministic")
TOKENS_KEYS = ("kind", "batch", "seq_len", "vocab_size", "seed", "labels", "attention_mask")
INPUT_FACTORY_KEYS = ("kind", "factory", "kwargs", "seed", "labels")
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
)


@dataclass(frozen=True)
class Defaults:
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    deterministic: bool = True


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    options: Mapping[str, Any]
    device: str
    dtype: str
    seed: int
    output: str | None
    where: str
    patch: str | None = None  # "module:function" applied to the built module (fault injection)


@dataclass(frozen=True)
class InputSpec:
    name: str
    kind: str
    batch: int = 1
    seq_len: int = 8
    vocab_size: int = 0
    seed: int = 0
    labels: bool = False
    attention_mask: bool = False
    factory: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    where: str = ""
    # kind: ids -- explicit token ids (rows) and an optional 0/1 attention mask
    input_ids: tuple[tuple[int, ...], ...] | None = None
    mask: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0


@dataclass(frozen=True)
class RecordSpec:
    mode: str = "stats"
    inputs: bool = True
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    format: str = "precalign"  # how saved traces are written: ours, or msprobe's dump layout
    level: str = "module"  # module hooks, op calls inside modules ("op"), or both ("mix")


@dataclass(frozen=True)
class CaseSpec:
    name: str
    baseline: str
    candidate: str
    inputs: str
    phases: tuple[Phase, ...]
    steps: int
    sync_weights: bool
    strict_weights: bool
    mapping: MappingSpec | None
    optimizer: OptimizerSpec
    record: RecordSpec
    tolerances: str | None
    expect: Expectation | None
    loss: str
    train: bool
    where: str
    isolate: bool = False
    # Cases that gate stored runs (msprobe dumps or our traces) instead of models.
    baseline_dump: Path | None = None
    candidate_dump: Path | None = None
    search: SearchSpec | None = None  # divergence search over generated inputs (search.py)
    # --align-baseline: renames from the candidate's names to a stored baseline's (e.g. modules
    # that moved between framework versions); stored traces and weights use the mapped names.
    baseline_rename: MappingSpec | None = None


@dataclass(frozen=True)
class AlignConfig:
    path: Path
    version: int
    defaults: Defaults
    models: Mapping[str, ModelSpec]
    inputs: Mapping[str, InputSpec]
    tolerances: Mapping[str, ToleranceTable]
    mappings: Mapping[str, MappingSpec]
    cases: tuple[CaseSpec, ...]
    digest: str

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def case(self, name: str) -> CaseSpec:
        for case in self.cases:
            if case.name == name:
                return case
        known = ", ".join(c.name for c in self.cases)
        raise ConfigError(f"{self.path}: no case named {name!r} (known: {known})")


def load_config_file(path: str | Path) -> AlignConfig:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{file}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{file}: is a directory, expected an alignment YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {exc}") from None
    return load_config(text, file)


def load_config(text: str, path: Path) -> AlignConfig:
    path = path.resolve()
    data = load_yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path}: the config is empty (expected a mapping with 'version: 1')")
    if not isinstance(data, dict):
        where = f"{path}:{data.line}" if isinstance(data, LineList) else str(path)
        raise ConfigError(
            f"{where}: expected a mapping with keys {', '.join(TOP_LEVEL_KEYS)}, got {describe(data)}"
        )
    root = Reader(data, str(path), "")
    root.check_keys(TOP_LEVEL_KEYS)
    if not root.has("version"):
        root.fail("missing required key 'version' (add 'version: 1' at the top)")
    version = root.raw("version")
    if version != 1 or isinstance(version, bool):
        root.fail(f"expected 1 (the only config version), got {version!r}", "version")
    defaults = _parse_defaults(root.get_mapping("defaults"))
    base_dir = path.parent

    models: dict[str, ModelSpec] = {}
    # Optional only when every case gates stored dumps (checked after the cases).
    models_reader = root.get_mapping("models")
    if models_reader is not None:
        for name, value in models_reader.data.items():
            models_reader.raw(name)
            models[name] = _parse_model(
                name, models_reader.child(name, value, models_reader.line_of(name)), defaults
            )
        if not models:
            models_reader.fail("at least one model is required")

    inputs: dict[str, InputSpec] = {}
    inputs_reader = root.get_mapping("inputs")
    if inputs_reader is not None:
        for name, value in inputs_reader.data.items():
            inputs_reader.raw(name)
            reader = inputs_reader.child(name, value, inputs_reader.line_of(name))
            inputs[name] = _parse_inputs(name, reader, defaults)

    tables: dict[str, ToleranceTable] = {}
    tables_reader = root.get_mapping("tolerances")
    if tables_reader is not None:
        for name, value in tables_reader.data.items():
            tables_reader.raw(name)
            if isinstance(value, str):
                _check_file(tables_reader, name, base_dir / value)
            tables[name] = parse_table(
                name,
                value,
                tables_reader.source,
                tables_reader.key_path(name),
                base_dir,
                line=tables_reader.line_of(name),
            )

    mappings: dict[str, MappingSpec] = {}
    # Kept to instantiate each case's mapping with its models' $variables.
    mapping_sources: dict[str, tuple[Any, Any]] = {}
    lenient = dict.fromkeys(_HEAD_FIELDS, 1)
    mappings_reader = root.get_mapping("mappings")
    if mappings_reader is not None:
        for name, value in mappings_reader.data.items():
            mappings_reader.raw(name)
            if isinstance(value, str):
                path = _check_file(mappings_reader, name, base_dir / value)
                mappings[name] = read_mapping_file(path, name, lenient)
                mapping_sources[name] = (path, None)
            else:
                reader = mappings_reader.child(name, value, mappings_reader.line_of(name))
                mappings[name] = parse_mapping(name, reader, lenient)
                mapping_sources[name] = (None, (value, mappings_reader.source, reader.path, reader.line))

    cases = []
    seen: set[str] = set()
    for i, item, line in root.items("cases"):
        case = _parse_case(
            root.child("cases", {}).child(i, item, line),
            models,
            inputs,
            tables,
            mapping_sources,
            base_dir,
        )
        if case.name in seen:
            root.child("cases", {}).child(i, item, line).fail(f"duplicate case name {case.name!r}", "name")
        seen.add(case.name)
        cases.append(case)
    if root.raw("cases") is None:
        root.fail("missing required key 'cases'")
    if models_reader is None and not (cases and all(c.baseline_dump for c in cases)):
        root.fail(
            "missing required key 'models' (only a config whose cases all gate {dump: path} may omit it)"
        )
    root.done()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return AlignConfig(
        path=path,
        version=1,
        defaults=defaults,
        models=models,
        inputs=inputs,
        tolerances=tables,
        mappings=mappings,
        cases=tuple(cases),
        digest=digest,
    )


def _parse_defaults(reader: Reader | None) -> Defaults:
    if reader is None:
        return Defaults()
    reader.check_keys(DEFAULTS_KEYS)
    out = Defaults(
        device=reader.get_choice("device", DEVICES, "cpu"),
        dtype=reader.get_choice("dtype", DTYPES, "float32"),
        seed=reader.get_int("seed", 0, minimum=0),
        deterministic=reader.get_bool("deterministic", True),
    )
    reader.done()
    return out


def _parse_model(name: str, reader: Reader, defaults: Defaults) -> ModelSpec:
    if not reader.has("source"):
        every = {key for info in SOURCES.values() for key in (*info.required, *info.optional)}
        reader.check_keys({*COMMON_MODEL_KEYS, *every})
    source = reader.get_str("source", required=True)
    info = SOURCES.get(source)
    if info is None:
        reader.fail(f"unknown source {source!r} (allowed: {', '.join(SOURCES)})", "source")
    reader.check_keys({*COMMON_MODEL_KEYS, *info.required, *info.optional})
    for key in info.required:
        reader.require(key)
    options = {key: reader.raw(key) for key in info.optional if reader.has(key)}
    for key in info.optional:
        reader.raw(key)
    if source == "hf" and "class" not in options and "pretrained" not in options:
        reader.fail("an hf model needs 'class' (e.g. transformers.Qwen2ForCausalLM) or 'pretrained'")
    if source in ("hf", "megatron") and "config" in options and not isinstance(options["config"], dict):
        reader.fail(f"expected a mapping of config fields, got {describe(options['config'])}", "config")
    for key in ("attn_implementation", "pretrained"):
        if key in options and not isinstance(options[key], str):
            reader.fail(f"expected a string, got {describe(options[key])}", key)
    if source == "factory":
        options["factory"] = reader.get_str("factory", required=True)
        _check_dotted(reader, "factory", options["factory"])
        kwargs = options.get("kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            reader.fail(f"expected a mapping of keyword arguments, got {describe(kwargs)}", "kwargs")
    if source == "megatron":
        reader.get_choice("preset", ("qwen2.5",), "qwen2.5")
        options.setdefault("preset", "qwen2.5")
        options.update(parse_parallel(reader))
    if source == "hf" and "class" in options:
        value = options["class"]
        if not isinstance(value, str) or "." not in value.replace(":", "."):
            reader.fail(
                f"expected a dotted class path like transformers.Qwen2ForCausalLM, got {value!r}", "class"
            )
    spec = ModelSpec(
        name=name,
        source=source,
        options=options,
        device=reader.get_choice("device", DEVICES, defaults.device),
        dtype=reader.get_choice("dtype", DTYPES, defaults.dtype),
        seed=reader.get_int("seed", defaults.seed, minimum=0),
        output=reader.get_str("output"),
        where=reader.where(),
        patch=_patch(reader),
    )
    reader.done()
    return spec


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


def _patch(reader: Reader) -> str | None:
    value: str | None = reader.get_str("patch")
    if value is not None:
        _check_dotted(reader, "patch", value)
    return value


def _check_dotted(reader: Reader, key: str, value: str) -> None:
    module, sep, attr = value.partition(":")
    if not sep or not attr.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        reader.fail(f"expected 'module:function' (e.g. my_pkg.models:build), got {value!r}", key)


def _check_file(reader: Reader, key: str, file: Path) -> Path:
    """A file a config key refers to: a missing one is reported at that key."""
    file = file.resolve()
    if not file.is_file():
        what = "is a directory, expected a YAML file" if file.is_dir() else "file not found"
        reader.fail(f"{what}: {file}", key)
    return file


def _parse_inputs(name: str, reader: Reader, defaults: Defaults) -> InputSpec:
    kind = reader.get_choice("kind", INPUT_KINDS, None)
    if kind is None:
        reader.fail(f"missing required key 'kind' (allowed: {', '.join(INPUT_KINDS)})")
    reader.check_keys({"tokens": TOKENS_KEYS, "ids": IDS_KEYS}.get(kind, INPUT_FACTORY_KEYS))
    if kind == "ids":
        ids, mask = parse_ids(reader)
        spec = InputSpec(
            name=name,
            kind=kind,
            batch=len(ids),
            seq_len=len(ids[0]),
            labels=reader.get_bool("labels", False),
            where=reader.where(),
            input_ids=ids,
            mask=mask,
        )
    elif kind == "tokens":
        spec = InputSpec(
            name=name,
            kind=kind,
            batch=reader.get_int("batch", 1, minimum=1),
            seq_len=reader.get_int("seq_len", 8, minimum=1),
            vocab_size=reader.get_int("vocab_size", None, minimum=1)
            or reader.fail("missing required key 'vocab_size'"),
            seed=reader.get_int("seed", defaults.seed, minimum=0),
            labels=reader.get_bool("labels", False),
            attention_mask=reader.get_bool("attention_mask", False),
            where=reader.where(),
        )
    else:
        factory = reader.get_str("factory", required=True)
        _check_dotted(reader, "factory", factory)
        kwargs = reader.raw("kwargs", {})
        if not isinstance(kwargs, dict):
            reader.fail(f"expected a mapping of keyword arguments, got {describe(kwargs)}", "kwargs")
        spec = InputSpec(
            name=name,
            kind=kind,
            seed=reader.get_int("seed", defaults.seed, minimum=0),
            labels=reader.get_bool("labels", False),
            factory=factory,
            kwargs=dict(kwargs),
            where=reader.where(),
        )
    reader.done()
    return spec


def _parse_case(
    reader: Reader,
    models: Mapping[str, ModelSpec],
    inputs: Mapping[str, InputSpec],
    tables: Mapping[str, ToleranceTable],
    mappings: Mapping[str, tuple[Any, Any]],
    base_dir: Path,
) -> CaseSpec:
    reader.check_keys(CASE_KEYS)
    name = reader.get_str("name", required=True)
    if not name or any(c in name for c in "[]:/ "):
        reader.fail(f"case names may not be empty or contain '[', ']', ':', '/' or spaces: {name!r}", "name")
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
    input_name = reader.get_str("inputs", required=not dumps) or ""
    if not dumps and input_name not in inputs:
        known = ", ".join(inputs) or "none defined under 'inputs'"
        reader.fail(f"unknown inputs {input_name!r} (known: {known})", "inputs")

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
    phases = phases_in_order(phases_value)  # optimizer steps need grads: backward is run (and compared) too
    steps = reader.get_int("steps", 1, minimum=1)

    weights = reader.get_mapping("weights")
    sync, strict = True, True
    if weights is not None:
        weights.check_keys(("sync", "strict"))
        sync = weights.get_bool("sync", True)
        strict = weights.get_bool("strict", True)
        weights.done()

    mapping: MappingSpec | None = None
    mapping_ref = reader.get_str("mapping")
    if mapping_ref is not None:
        variables = {} if dumps else mapping_variables(models[refs["baseline"]], models[refs["candidate"]])
        if mapping_ref in mappings:
            path, inline = mappings[mapping_ref]
            if path is not None:
                mapping = read_mapping_file(path, mapping_ref, variables)
            else:
                value, source, key_path, line = inline
                mapping = parse_mapping(mapping_ref, Reader(value, source, key_path, line), variables)
        elif mapping_ref.startswith("preset:"):
            mapping = _preset(
                reader, mapping_ref, variables, models[refs["baseline"]], models[refs["candidate"]]
            )
        elif mapping_ref.endswith((".yaml", ".yml")):
            mapping = read_mapping_file(
                _check_file(reader, "mapping", base_dir / mapping_ref), mapping_ref, variables
            )
        else:
            known = ", ".join([*mappings, *(f"preset:{p}" for p in PRESET_MAPPINGS)])
            reader.fail(f"unknown mapping {mapping_ref!r} (known: {known}; or a .yaml file)", "mapping")

    layer_ref = reader.get_str("layer_mapping")
    if layer_ref is not None:
        layers = _layer_mapping(reader, layer_ref, base_dir)
        mapping = (
            replace(mapping, layer_mapping=layers)
            if mapping
            else MappingSpec(layer_ref, layer_mapping=layers)
        )

    baseline_rename = None
    rename_ref = reader.get_str("stored_layer_mapping")
    if rename_ref is not None:
        baseline_rename = MappingSpec(
            rename_ref, layer_mapping=_layer_mapping(reader, rename_ref, base_dir, "stored_layer_mapping")
        )

    optimizer = OptimizerSpec()
    opt = reader.get_mapping("optimizer")
    if opt is not None:
        opt.check_keys(("name", "lr", "betas", "eps", "weight_decay", "momentum"))
        betas = opt.raw("betas", [0.9, 0.999])
        if (
            not isinstance(betas, list)
            or len(betas) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
        ):
            opt.fail(f"expected two numbers, got {betas!r}", "betas")
        optimizer = OptimizerSpec(
            name=opt.get_choice("name", OPTIMIZERS, "adamw"),
            lr=opt.get_float("lr", 1e-3, non_negative=True),
            betas=(float(betas[0]), float(betas[1])),
            eps=opt.get_float("eps", 1e-8, non_negative=True),
            weight_decay=opt.get_float("weight_decay", 0.0, non_negative=True),
            momentum=opt.get_float("momentum", 0.0, non_negative=True),
        )
        opt.done()

    record = RecordSpec()
    rec = reader.get_mapping("record")
    if rec is not None:
        rec.check_keys(("mode", "inputs", "include", "exclude", "format", "level"))
        record = RecordSpec(
            mode=rec.get_choice("mode", MODES, "stats"),
            inputs=rec.get_bool("inputs", True),
            include=_str_tuple(rec, "include"),
            exclude=_str_tuple(rec, "exclude"),
            format=rec.get_choice("format", ("precalign", "msprobe"), "precalign"),
            level=rec.get_choice("level", LEVELS, "module"),
        )
        rec.done()

    table = reader.get_str("tolerances")
    if table is not None and table not in tables:
        known = ", ".join(tables) or "none defined under 'tolerances'"
        reader.fail(f"unknown tolerance table {table!r} (known: {known})", "tolerances")

    expect = None
    exp = reader.get_mapping("expect")
    if exp is not None:
        exp.check_keys(("phase", "first_divergence", "origin", "kind"))
        phase = exp.get_choice("phase", PHASES, phases[0])
        if phase not in phases:
            exp.fail(f"phase {phase!r} is not among the case's phases ({', '.join(phases)})", "phase")
        origin = exp.raw("origin")
        if origin is not None and not isinstance(origin, bool):
            exp.fail(f"expected true or false, got {origin!r}", "origin")
        expect = Expectation(
            phase=phase,
            first_divergence=exp.get_str("first_divergence", required=True),
            origin=origin,
            kind=exp.get_str("kind"),
            where=exp.where(),
        )
        exp.done()

    loss = reader.get_choice("loss", LOSSES, "causal_lm")
    if "backward" in phases and not dumps:
        # What run_side would reject only when the case runs: report it with the config.
        if loss == "none":
            reader.fail("phase 'backward' needs a loss (allowed here: causal_lm, model, mean)", "loss")
        spec = inputs[input_name]
        if loss == "causal_lm" and spec.kind in ("tokens", "ids") and not spec.labels:
            reader.fail(
                f"phase 'backward' with loss 'causal_lm' needs labels: set 'labels: true' in "
                f"inputs.{input_name}, or choose loss: mean or loss: model",
                "loss" if reader.has("loss") else "phases",
            )

    for side in ("baseline", "candidate"):
        model_spec = models.get(refs[side])
        if record.level != "module" and model_spec is not None and launched(model_spec.options):
            reader.fail(
                f"record level {record.level!r} is not supported with tensor_parallel > 1 "
                f"(model {refs[side]!r}); use level module",
                "record",
            )

    case = CaseSpec(
        name=name,
        baseline=refs["baseline"],
        candidate=refs["candidate"],
        inputs=input_name,
        phases=phases,
        steps=steps,
        sync_weights=sync,
        strict_weights=strict,
        mapping=mapping,
        optimizer=optimizer,
        record=record,
        tolerances=table,
        expect=expect,
        loss=loss,
        train=reader.get_bool("train", False),
        isolate=_isolate(reader, record, models.get(refs["candidate"])),
        baseline_dump=dumps.get("baseline"),
        candidate_dump=dumps.get("candidate"),
        where=reader.where(),
        search=_search(
            reader, inputs.get(input_name), models.get(refs["candidate"]), models.get(refs["baseline"])
        ),
        baseline_rename=baseline_rename,
    )
    reader.done()
    return case


PRESET_MAPPINGS = ("megatron-qwen2.5",)
PRESET_LAYER_MAPPINGS = (
    "qwen2.5-mindspeed-to-hf",
    "qwen2.5-hf-to-mindspeed",
    "qwen2.5-vl-mindspeed-to-hf",
    "qwen2.5-vl-hf-to-mindspeed",
)


def layer_mapping_path(ref: str, base_dir: Path) -> Path | None:
    """A layer_mapping reference: ``preset:NAME`` (seed 000's templates) or a YAML path."""
    if ref.startswith("preset:"):
        name = ref.partition(":")[2]
        if name not in PRESET_LAYER_MAPPINGS:
            return None
        return PRESETS_DIR / "layer_mapping" / f"{name}.yaml"
    return base_dir / ref


def _layer_mapping(reader: Reader, ref: str, base_dir: Path, key: str = "layer_mapping") -> LayerMapping:
    path = layer_mapping_path(ref, base_dir)
    if path is None:
        allowed = ", ".join(f"preset:{p}" for p in PRESET_LAYER_MAPPINGS)
        reader.fail(f"unknown preset {ref!r} (allowed: {allowed}; or a .yaml file)", key)
    if not path.is_file():
        reader.fail(f"file not found: {path}", key)
    return read_layer_mapping(path)


_HEAD_FIELDS = ("num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size")


def mapping_variables(*models: ModelSpec) -> dict[str, Any]:
    """``$variables`` a mapping may use, read from the models' configs (Megatron's first, as
    its layout is what the transforms describe)."""
    out: dict[str, Any] = {}
    for model in sorted(models, key=lambda m: m.source != "megatron"):
        config = model.options.get("config")
        fields = dict(config) if isinstance(config, dict) else {}
        if model.source == "megatron":
            fields = {**QWEN2_FIELDS, **fields}
        for key in _HEAD_FIELDS:
            if key in fields and key not in out:
                out[key] = fields[key]
    return out


def _preset(
    reader: Reader, ref: str, variables: dict[str, Any], baseline: ModelSpec, candidate: ModelSpec
) -> MappingSpec:
    """A built-in mapping, oriented baseline = HF, candidate = Megatron; reversed when the
    case has them the other way round."""
    name = ref.partition(":")[2]
    if name not in PRESET_MAPPINGS:
        allowed = ", ".join(f"preset:{p}" for p in PRESET_MAPPINGS)
        reader.fail(f"unknown preset mapping {ref!r} (allowed: {allowed})", "mapping")
    missing = [k for k in ("num_attention_heads", "num_key_value_heads") if k not in variables]
    if missing:
        reader.fail(f"{ref} needs {missing[0]} in a model's config", "mapping")
    path = PRESETS_DIR / f"{name}.yaml"
    try:
        mapping = read_mapping_file(path, ref, variables)
    except ConfigError as exc:  # the models' config does not fit the preset
        reader.fail(f"{ref} does not fit these models: {str(exc).rpartition(': ')[2]}", "mapping")
    if baseline.source == "megatron" and candidate.source != "megatron":
        mapping = reverse(mapping)
    return mapping


def _str_tuple(reader: Reader, key: str) -> tuple[str, ...]:
    value = reader.raw(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        reader.fail("expected a glob or a list of globs", key)
    return tuple(value)
