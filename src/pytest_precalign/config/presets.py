"""Presets shipped with the package: mappings (``preset:NAME``) and msprobe layer_mapping files,
and the model-config fields (``$variables``) a mapping may use."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..mapping.spec import MappingSpec, read_mapping_file, reverse
from ..yaml_reader import Reader
from .specs import ModelSpec

# The data folder stays at the package root (``presets/``, listed in pyproject's package-data).
PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"

# HF Qwen2 config fields the preset reads, with Qwen2Config's defaults.
QWEN2_FIELDS: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}

# Fields shared by the Llama and Qwen3 configs beyond Qwen2's: the per-head size (None: hidden
# / heads), rotary scaling (the legacy ``rope_scaling`` or transformers 5's ``rope_parameters``)
# and the linear biases, which these presets build without (False is the only value allowed).
_ROPE_AND_BIAS: dict[str, Any] = {
    "head_dim": None,
    "rope_scaling": None,
    "rope_parameters": None,
    "attention_bias": False,
}

# HF config fields each ``source: megatron`` preset reads, with its HF config class's defaults;
# ``num_key_value_heads`` None means "as many as num_attention_heads" (HF's rule).
MEGATRON_PRESET_FIELDS: dict[str, dict[str, Any]] = {
    "qwen2.5": QWEN2_FIELDS,
    "llama": {
        **QWEN2_FIELDS,
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "num_key_value_heads": None,
        "max_position_embeddings": 2048,
        **_ROPE_AND_BIAS,
        "mlp_bias": False,
    },
    "qwen3": {**QWEN2_FIELDS, **_ROPE_AND_BIAS, "head_dim": 128, "use_sliding_window": False},
    # MoE: experts (num_local_experts / num_experts, each an intermediate_size /
    # moe_intermediate_size SwiGLU), a top-k router, no shared expert, the router aux loss off
    # (output_router_logits false: HF adds it to the loss only then; Megatron's coefficient 0).
    "mixtral": {
        **QWEN2_FIELDS,
        "vocab_size": 32000,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096 * 32,
        **_ROPE_AND_BIAS,
        "sliding_window": None,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "router_jitter_noise": 0.0,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    },
    "qwen3-moe": {
        **QWEN2_FIELDS,
        **_ROPE_AND_BIAS,
        "head_dim": 128,
        "use_sliding_window": False,
        "num_key_value_heads": 4,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": False,
        "decoder_sparse_step": 1,
        "mlp_only_layers": None,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    },
}
# Fields whose value is fixed by the preset (anything else is not this family's model); checked
# where the preset reads the field. ``None`` stands for "unset" as well.
FIXED_FIELDS: dict[str, Any] = {
    "attention_bias": False,
    "mlp_bias": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "router_jitter_noise": 0.0,
    "output_router_logits": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}


def preset_fields(preset: str, given: dict[str, Any]) -> dict[str, Any]:
    """A preset's view of a model config: its defaults overlaid with the known ``given`` fields,
    ``num_key_value_heads`` and ``head_dim`` resolved as HF resolves them."""
    defaults = MEGATRON_PRESET_FIELDS.get(preset, QWEN2_FIELDS)
    fields = {**defaults, **{k: v for k, v in given.items() if k in defaults}}
    if fields["num_key_value_heads"] is None:
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    if fields.get("head_dim", 0) is None:
        fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    if "num_local_experts" in fields:  # Mixtral's name (HF's attribute_map: num_experts)
        fields["num_experts"] = fields["num_local_experts"]
    return fields


PRESET_MAPPINGS = (
    "megatron-qwen2.5",
    "megatron-llama",
    "megatron-qwen3",
    "megatron-mixtral",
    "megatron-qwen3-moe",
)
PRESET_LAYER_MAPPINGS = (
    "qwen2.5-mindspeed-to-hf",
    "qwen2.5-hf-to-mindspeed",
    "qwen2.5-vl-mindspeed-to-hf",
    "qwen2.5-vl-hf-to-mindspeed",
)

# The model-config fields a mapping's ``$variables`` may name.
HEAD_FIELDS = (
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "num_experts",
)


def layer_mapping_path(ref: str, base_dir: Path) -> Path | None:
    """A layer_mapping reference: ``preset:NAME`` (seed 000's templates) or a YAML path."""
    if ref.startswith("preset:"):
        name = ref.partition(":")[2]
        if name not in PRESET_LAYER_MAPPINGS:
            return None
        return PRESETS_DIR / "layer_mapping" / f"{name}.yaml"
    return base_dir / ref


def mapping_variables(*models: ModelSpec) -> dict[str, Any]:
    """``$variables`` a mapping may use, read from the models' configs (Megatron's first, as
    its layout is what the transforms describe)."""
    out: dict[str, Any] = {}
    for model in sorted(models, key=lambda m: not m.megatron_core):
        config = model.options.get("config")
        fields = dict(config) if isinstance(config, dict) else {}
        if model.source == "megatron":
            fields = preset_fields(str(model.options.get("preset", "qwen2.5")), fields)
        elif "num_local_experts" in fields:
            fields["num_experts"] = fields["num_local_experts"]
        for key in HEAD_FIELDS:
            if key in fields and key not in out:
                out[key] = fields[key]
    return out


# megatron-core's TransformerConfig names for the fields a mapping may use.
_MEGATRON_NAMES = {
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_query_groups",
    "hidden_size": "hidden_size",
    "intermediate_size": "ffn_hidden_size",
    "num_experts": "num_moe_experts",
}


def manifest_variables(*manifests: Mapping[str, Any]) -> dict[str, Any]:
    """``$variables`` a mapping may use, read from recorded runs' ``model_config`` (the
    ``Recorder`` writes a Hugging Face config or megatron-core's ``TransformerConfig`` there),
    Megatron's first as in ``mapping_variables``; {} for runs that carry none."""
    configs = [m.get("model_config") for m in manifests]
    found = [c for c in configs if isinstance(c, Mapping) and isinstance(c.get("fields"), Mapping)]
    out: dict[str, Any] = {}
    for config in sorted(found, key=lambda c: c.get("source") != "megatron-core"):
        fields = config["fields"]
        if config.get("source") == "megatron-core":
            view = {key: fields.get(name) for key, name in _MEGATRON_NAMES.items()}
        else:
            view = {key: fields.get(key) for key in HEAD_FIELDS}
            view["num_experts"] = fields.get("num_local_experts", fields.get("num_experts"))
        if view.get("num_key_value_heads") is None:  # as HF and megatron-core resolve it
            view["num_key_value_heads"] = view.get("num_attention_heads")
        for key, value in view.items():
            if isinstance(value, int) and not isinstance(value, bool) and key not in out:
                out[key] = value
    return out


def resolve_preset(
    ref: str, variables: Mapping[str, Any], where: str, *, megatron_baseline: bool
) -> MappingSpec:
    """THE resolver of ``preset:NAME`` (a config's ``mapping:``, the marker's and
    ``align_runner``'s ``mapping=``, ``precalign compare --mapping``): the built-in mapping,
    written baseline = HF, candidate = Megatron, reversed when the baseline is the Megatron
    model. It needs the head counts; ``ConfigError`` starting with ``where`` otherwise."""
    name = ref.partition(":")[2]
    if name not in PRESET_MAPPINGS:
        allowed = ", ".join(f"preset:{p}" for p in PRESET_MAPPINGS)
        raise ConfigError(f"{where}: unknown preset mapping {ref!r} (allowed: {allowed})")
    missing = [k for k in ("num_attention_heads", "num_key_value_heads") if k not in variables]
    if missing:
        raise ConfigError(f"{where}: {ref} needs {missing[0]} in a model's config")
    try:
        mapping = read_mapping_file(PRESETS_DIR / f"{name}.yaml", ref, dict(variables))
    except ConfigError as exc:  # the models' config does not fit the preset
        raise ConfigError(
            f"{where}: {ref} does not fit these models: {str(exc).rpartition(': ')[2]}"
        ) from None
    return reverse(mapping) if megatron_baseline else mapping


def preset_mapping(
    reader: Reader, ref: str, variables: dict[str, Any], baseline: ModelSpec, candidate: ModelSpec
) -> MappingSpec:
    """A config case's ``mapping: preset:NAME`` (``resolve_preset``; errors at the key)."""
    megatron_baseline = baseline.megatron_core and not candidate.megatron_core
    try:
        return resolve_preset(ref, variables, "mapping", megatron_baseline=megatron_baseline)
    except ConfigError as exc:
        reader.fail(str(exc).partition("mapping: ")[2], "mapping")
