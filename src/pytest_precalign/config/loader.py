"""Alignment config: YAML text -> frozen ``AlignConfig``. No torch, no pytest.

Errors are ``ConfigError`` with one message naming the file, the line, the key path and
what is allowed (see ``yaml_reader.Reader``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..compare.tolerances import ToleranceTable, parse_table
from ..errors import ConfigError
from ..mapping.spec import MappingSpec, parse_mapping, read_mapping_file
from ..yaml_reader import LineList, Reader, describe, load_yaml, read_text_file
from .cases import MappingSource, check_file, parse_case
from .launch import parse_parallel
from .model_sources import COMMON_MODEL_KEYS, FACTORY_RUNTIMES, SOURCES
from .model_weights import parse_model_weights
from .presets import HEAD_FIELDS, MEGATRON_PRESET_FIELDS
from .search import IDS_KEYS, parse_ids
from .specs import AlignConfig, CaseSpec, Defaults, InputSpec, ModelSpec
from .training import parse_dataset

DEVICES = ("cpu", "cuda", "npu")
DTYPES = ("float32", "float16", "bfloat16", "float64", "keep")
INPUT_KINDS = ("tokens", "factory", "ids", "dataset")
TOP_LEVEL_KEYS = ("version", "defaults", "models", "inputs", "tolerances", "mappings", "cases")
DEFAULTS_KEYS = ("device", "dtype", "seed", "deterministic")
TOKENS_KEYS = ("kind", "batch", "seq_len", "vocab_size", "seed", "labels", "attention_mask")
INPUT_FACTORY_KEYS = ("kind", "factory", "kwargs", "seed", "labels")


def load_config_file(path: str | Path) -> AlignConfig:
    file = Path(path)
    if not file.exists() and not file.is_symlink():
        raise ConfigError(f"{file}: config file not found")
    return load_config(read_text_file(file, "an alignment YAML file"), file)


def load_config(text: str, path: Path) -> AlignConfig:
    path = path.resolve()
    root = _root(load_yaml(text, str(path)), path)
    defaults = _parse_defaults(root.get_mapping("defaults"))
    base_dir = path.parent
    # Optional only when every case gates stored dumps (checked after the cases).
    models_reader = root.get_mapping("models")
    models = _parse_models(models_reader, defaults)
    inputs = _parse_input_specs(root.get_mapping("inputs"), defaults, path.parent)
    tables = _parse_tables(root.get_mapping("tolerances"), base_dir)
    mappings, mapping_sources = _parse_mappings(root.get_mapping("mappings"), base_dir)
    cases = _parse_cases(root, models, inputs, tables, mapping_sources, base_dir)
    if models_reader is None and not (cases and all(c.dumps for c in cases)):
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
        cases=cases,
        digest=digest,
    )


def _root(data: Any, path: Path) -> Reader:
    """The top-level mapping, with its keys and ``version: 1`` checked."""
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
    return root


def _parse_models(reader: Reader | None, defaults: Defaults) -> dict[str, ModelSpec]:
    models: dict[str, ModelSpec] = {}
    if reader is not None:
        for name, value in reader.data.items():
            reader.raw(name)
            models[name] = _parse_model(name, reader.child(name, value, reader.line_of(name)), defaults)
        if not models:
            reader.fail("at least one model is required")
    return models


def _parse_input_specs(reader: Reader | None, defaults: Defaults, base_dir: Path) -> dict[str, InputSpec]:
    inputs: dict[str, InputSpec] = {}
    if reader is not None:
        for name, value in reader.data.items():
            reader.raw(name)
            child = reader.child(name, value, reader.line_of(name))
            if isinstance(value, dict) and value.get("kind") == "dataset":
                inputs[name] = parse_dataset(name, child, base_dir)
                continue
            inputs[name] = _parse_inputs(name, child, defaults)
    return inputs


def _parse_tables(reader: Reader | None, base_dir: Path) -> dict[str, ToleranceTable]:
    tables: dict[str, ToleranceTable] = {}
    if reader is not None:
        for name, value in reader.data.items():
            reader.raw(name)
            if isinstance(value, str):
                check_file(reader, name, base_dir / value)
            tables[name] = parse_table(
                name, value, reader.source, reader.key_path(name), base_dir, line=reader.line_of(name)
            )
    return tables


def _parse_mappings(
    reader: Reader | None, base_dir: Path
) -> tuple[dict[str, MappingSpec], dict[str, MappingSource]]:
    """The named mappings, parsed leniently (any head count) for ``AlignConfig.mappings``, and
    their sources, kept to instantiate each case's mapping with its models' $variables."""
    mappings: dict[str, MappingSpec] = {}
    sources: dict[str, MappingSource] = {}
    lenient = dict.fromkeys(HEAD_FIELDS, 1)
    if reader is not None:
        for name, value in reader.data.items():
            reader.raw(name)
            if isinstance(value, str):
                path = check_file(reader, name, base_dir / value)
                mappings[name] = read_mapping_file(path, name, lenient)
                sources[name] = (path, None)
            else:
                child = reader.child(name, value, reader.line_of(name))
                mappings[name] = parse_mapping(name, child, lenient)
                sources[name] = (None, (value, reader.source, child.path, child.line))
    return mappings, sources


def _parse_cases(
    root: Reader,
    models: Mapping[str, ModelSpec],
    inputs: Mapping[str, InputSpec],
    tables: Mapping[str, ToleranceTable],
    mappings: Mapping[str, MappingSource],
    base_dir: Path,
) -> tuple[CaseSpec, ...]:
    cases = []
    seen: set[str] = set()
    for i, item, line in root.items("cases"):
        case = parse_case(
            root.child("cases", {}).child(i, item, line), models, inputs, tables, mappings, base_dir
        )
        if case.name in seen:
            root.child("cases", {}).child(i, item, line).fail(f"duplicate case name {case.name!r}", "name")
        seen.add(case.name)
        cases.append(case)
    if root.raw("cases") is None:
        root.fail("missing required key 'cases'")
    return tuple(cases)


def _parse_defaults(reader: Reader | None) -> Defaults:
    if reader is None:
        return Defaults()
    reader.check_keys(DEFAULTS_KEYS)
    out = Defaults(
        device=reader.get_choice("device", DEVICES, "cpu"),
        dtype=reader.get_choice("dtype", DTYPES, "float32"),
        seed=reader.get_int("seed", 0, minimum=0),
        deterministic=reader.get_bool("deterministic", True),
        dtype_given=reader.has("dtype"),
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
        if reader.has("runtime"):
            options["runtime"] = reader.get_choice("runtime", FACTORY_RUNTIMES)
    if source == "megatron":
        reader.get_choice("preset", tuple(MEGATRON_PRESET_FIELDS), "qwen2.5")
        options.setdefault("preset", "qwen2.5")
        options.update(parse_parallel(reader))
    if source == "hf" and "class" in options:
        value = options["class"]
        if not isinstance(value, str) or "." not in value.replace(":", "."):
            reader.fail(
                f"expected a dotted class path like transformers.Qwen2ForCausalLM, got {value!r}", "class"
            )
    weights = parse_model_weights(reader)
    if weights is not None:
        options["weights"] = weights
    spec = ModelSpec(
        name=name,
        source=source,
        options=options,
        device=reader.get_choice("device", DEVICES, defaults.device),
        dtype=reader.get_choice("dtype", DTYPES, _default_dtype(source, options, defaults)),
        seed=reader.get_int("seed", defaults.seed, minimum=0),
        output=reader.get_str("output"),
        where=reader.where(),
        patch=_patch(reader),
    )
    reader.done()
    return spec


def _default_dtype(source: str, options: dict[str, Any], defaults: Defaults) -> str:
    """A model built by the user's code (``factory``) or loaded from their checkpoint
    (``pretrained``) keeps its own dtypes -- a bf16 model with fp32 norms stays so -- unless the
    config says otherwise; a model built from a config dict gets the defaults' dtype."""
    if defaults.dtype_given:
        return defaults.dtype
    return "keep" if source == "factory" or "pretrained" in options else defaults.dtype


def _patch(reader: Reader) -> str | None:
    value: str | None = reader.get_str("patch")
    if value is not None:
        _check_dotted(reader, "patch", value)
    return value


def _check_dotted(reader: Reader, key: str, value: str) -> None:
    module, sep, attr = value.partition(":")
    if not sep or not attr.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        reader.fail(f"expected 'module:function' (e.g. my_pkg.models:build), got {value!r}", key)


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
