"""``source: megatron``: a megatron-core ``GPTModel`` (local layer spec: no Transformer Engine,
no apex) built from a preset whose ``TransformerConfig`` is derived from an HF-style config.

Every preset: GQA groups, SwiGLU (``linear_fc1`` = ``[gate; up]``), RMSNorm with the config's
eps, rotary base from ``rope_theta``, untied embeddings unless ``tie_word_embeddings``, dropout 0.
What differs between the families is here and only here (``FAMILIES``, ``rope``):
``qwen2.5`` has a q/k/v bias and no other linear bias; ``llama`` (Llama 2/3) no linear bias,
an explicit ``head_dim`` and Llama-3.1 rotary scaling (``rope_type: llama3``); ``qwen3`` no
bias, RMSNorm of q and k per head (Megatron's ``qk_layernorm``) and ``head_dim`` (``kv_channels``)
independent of hidden_size / heads; ``mixtral`` (as llama) and ``qwen3-moe`` (as qwen3) replace
every MLP by a MoELayer: a softmax top-k router and ``SequentialMLP`` experts (``moe_options``).

torch.distributed is initialised by ``runtime`` where nobody has (gloo on CPU, nccl on CUDA,
hccl on NPU) and torn down after the case. The CUDA assumptions of megatron-core on a
CPU-only torch are handled here and only here (see ``cpu_workarounds``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.presets import FIXED_FIELDS, MEGATRON_PRESET_FIELDS, preset_fields
from ..errors import SourceError

if TYPE_CHECKING:
    import torch

    from ..config.specs import ModelSpec

PRESETS = tuple(MEGATRON_PRESET_FIELDS)
# Fields an HF config may carry that do not change the Megatron model.
IGNORED_FIELDS = ("hidden_act", "attention_dropout", "use_cache", "initializer_range", "torch_dtype", "dtype")
# Qwen3's sliding-window layout, unused while use_sliding_window is false (a fixed field).
SLIDING_FIELDS = ("sliding_window", "max_window_layers", "layer_types")


@dataclass(frozen=True)
class Family:
    """What a preset's TransformerConfig and layer spec set beyond the shared ones."""

    qkv_bias: bool  # add_qkv_bias: a bias on the fused q/k/v projection only
    qk_layernorm: bool  # RMSNorm of each head of q and k before rope
    own_head_dim: bool  # head_dim (kv_channels) read from the config, else hidden / heads
    moe: bool = False  # every layer's MLP is a MoELayer (router + SequentialMLP experts)


FAMILIES = {
    "qwen2.5": Family(qkv_bias=True, qk_layernorm=False, own_head_dim=False),
    "llama": Family(qkv_bias=False, qk_layernorm=False, own_head_dim=True),
    "qwen3": Family(qkv_bias=False, qk_layernorm=True, own_head_dim=True),
    "mixtral": Family(qkv_bias=False, qk_layernorm=False, own_head_dim=True, moe=True),
    "qwen3-moe": Family(qkv_bias=False, qk_layernorm=True, own_head_dim=True, moe=True),
}
ROPE_TYPES = ("default", "llama3")
# What a refusal of a family's field adds: where a model no preset builds goes.
OWN_MODEL = (
    "; a family no preset builds is your own megatron-core model through source: factory with "
    "runtime: megatron (docs/megatron_vs_hf.md, 'Your own Megatron model')"
)
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _megatron() -> Any:
    return available("source 'megatron'")


def available(who: str) -> Any:
    """megatron-core's ``parallel_state``, or one error saying ``who`` needs it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core  # noqa: F401
            from megatron.core import parallel_state
    except ImportError as exc:
        raise SourceError(
            f"{who} needs megatron-core, which is missing ({exc.name}): "
            "pip install 'pytest-precalign[megatron]'"
        ) from None
    return parallel_state


def preset_of(spec: ModelSpec) -> str:
    preset = spec.options.get("preset", "qwen2.5")
    if preset not in PRESETS:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.preset: unknown preset {preset!r} (allowed: {', '.join(PRESETS)})"
        )
    return str(preset)


def megatron_fields(spec: ModelSpec) -> dict[str, Any]:
    """The preset's view of the model config: defaults overlaid with ``config:``."""
    preset = preset_of(spec)
    known = MEGATRON_PRESET_FIELDS[preset]
    given = dict(spec.options.get("config") or {})
    ignored = IGNORED_FIELDS + (SLIDING_FIELDS if "use_sliding_window" in known else ())
    unknown = sorted(k for k in given if k not in known and k not in ignored)
    what = f"{spec.where}: models.{spec.name}.config"
    if unknown:
        raise SourceError(
            f"{what}: unknown field {unknown[0]!r} for preset {preset!r} (allowed: {', '.join(known)})"
            + OWN_MODEL
        )
    for key, value in FIXED_FIELDS.items():
        if key in given and key in known and given[key] not in (value, None):
            raise SourceError(
                f"{what}.{key}: preset {preset!r} builds without it (allowed: {str(value).lower()})"
                + OWN_MODEL
            )
    fields = preset_fields(preset, given)
    rope(fields, what)
    heads, groups = fields["num_attention_heads"], fields["num_key_value_heads"]
    if heads % groups:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.config: num_attention_heads ({heads}) must be a "
            f"multiple of num_key_value_heads ({groups})"
        )
    if not FAMILIES[preset].own_head_dim and fields["hidden_size"] % heads:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.config: hidden_size ({fields['hidden_size']}) must be "
            f"a multiple of num_attention_heads ({heads})"
        )
    _check_parallel(spec, preset, fields)
    return fields


def _check_parallel(spec: ModelSpec, preset: str, fields: Mapping[str, Any]) -> None:
    """Tensor, pipeline and expert parallel sizes against the model they split."""
    tp, groups = tensor_parallel(spec), fields["num_key_value_heads"]
    ep = expert_parallel(spec)
    if FAMILIES[preset].moe:
        _check_moe(fields, tp, ep, f"{spec.where}: models.{spec.name}")
    elif ep != 1:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.expert_parallel: preset {preset!r} has no experts (allowed: 1)"
        )
    pp = pipeline_parallel(spec)
    if ep > 1 and pp > 1:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.pipeline_parallel: expert_parallel runs at pipeline_parallel 1 "
            "(allowed: 1)"
        )
    if fields["num_hidden_layers"] % pp:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.pipeline_parallel: {pp} must divide num_hidden_layers "
            f"({fields['num_hidden_layers']})"
        )
    if groups % tp or fields["vocab_size"] % tp or fields["intermediate_size"] % tp:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.tensor_parallel: {tp} must divide num_key_value_heads "
            f"({groups}), vocab_size ({fields['vocab_size']}) and intermediate_size "
            f"({fields['intermediate_size']})"
        )


def _check_moe(fields: Mapping[str, Any], tp: int, ep: int, what: str) -> None:
    if tp != 1:
        raise SourceError(f"{what}.tensor_parallel: experts are built at tensor_parallel 1 (allowed: 1)")
    top_k, experts = fields["num_experts_per_tok"], fields["num_experts"]
    if experts % ep:
        raise SourceError(f"{what}.expert_parallel: {ep} must divide the number of experts ({experts})")
    if not 1 <= top_k <= experts:
        raise SourceError(
            f"{what}.config.num_experts_per_tok: {top_k} must be between 1 and the number of experts ({experts})"
        )


def moe_options(f: Mapping[str, Any]) -> dict[str, Any]:
    """The MoE part of a TransformerConfig. HF's top-k router takes the softmax over all
    experts, then the top k, renormalised (Mixtral; Qwen3-MoE with ``norm_topk_prob``): the
    softmax over the top-k logits, Megatron's default; without renormalising it is Megatron's
    ``moe_router_pre_softmax``. No aux loss, no token dropping; on the CPU the experts are a
    ``SequentialMLP`` (no grouped GEMM) and tokens go through the allgather dispatcher (the
    alltoall one creates a CUDA stream when built)."""
    return {
        "num_moe_experts": f["num_experts"],
        "moe_router_topk": f["num_experts_per_tok"],
        "moe_ffn_hidden_size": f.get("moe_intermediate_size", f["intermediate_size"]),
        "moe_router_pre_softmax": not f.get("norm_topk_prob", True),
        "moe_router_score_function": "softmax",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": False,
        "moe_token_dispatcher_type": "allgather",
    }


def rope(fields: Mapping[str, Any], what: str = "config") -> tuple[float, dict[str, Any] | None]:
    """Rotary base and Llama-3.1 scaling (None: unscaled) from ``rope_theta``/``rope_scaling``
    or transformers 5's ``rope_parameters``; another rope type is one error."""
    key = "rope_parameters" if fields.get("rope_parameters") else "rope_scaling"
    params = fields.get(key) or {}
    if not isinstance(params, Mapping):
        raise SourceError(f"{what}.{key}: expected a mapping, got {params!r}")
    theta = float(params.get("rope_theta", fields["rope_theta"]))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise SourceError(
            f"{what}.{key}.rope_type: {kind!r} is not built by source megatron "
            f"(allowed: {', '.join(ROPE_TYPES)})" + OWN_MODEL
        )
    if kind == "default":
        return theta, None
    missing = [k for k in LLAMA3_ROPE_KEYS if k not in params]
    if missing:
        raise SourceError(f"{what}.{key}: rope_type llama3 needs {missing[0]}")
    return theta, {k: float(params[k]) for k in LLAMA3_ROPE_KEYS}


def tensor_parallel(spec: ModelSpec) -> int:
    tp = spec.options.get("tensor_parallel", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.tensor_parallel: expected an integer >= 1, got {tp!r}"
        )
    return tp


def expert_parallel(spec: ModelSpec) -> int:
    ep = spec.options.get("expert_parallel", 1)
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.expert_parallel: expected an integer >= 1, got {ep!r}"
        )
    return ep


def data_parallel(spec: ModelSpec) -> int:
    """Data-parallel replicas of a launched model (megatron-core's DP world: the ranks beyond
    tensor x pipeline x expert parallelism)."""
    dp = spec.options.get("data_parallel", 1)
    if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.data_parallel: expected an integer >= 1, got {dp!r}"
        )
    return dp


def pipeline_parallel(spec: ModelSpec) -> int:
    pp = spec.options.get("pipeline_parallel", 1)
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise SourceError(
            f"{spec.where}: models.{spec.name}.pipeline_parallel: expected an integer >= 1, got {pp!r}"
        )
    return pp


RECOMPUTE_GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")


def recompute(spec: ModelSpec) -> dict[str, Any]:
    """Activation recomputation, as megatron-core's TransformerConfig takes it (on the CPU, the
    recomputed forward runs inside ``cpu_workarounds``: its RNG state save/restore)."""
    opts = spec.options
    what = f"{spec.where}: models.{spec.name}"
    granularity = opts.get("recompute_granularity")
    if granularity is None:
        for key in ("recompute_method", "recompute_num_layers"):
            if key in opts:
                raise SourceError(f"{what}.{key}: needs recompute_granularity (allowed: full, selective)")
        return {}
    if granularity not in RECOMPUTE_GRANULARITIES:
        raise SourceError(
            f"{what}.recompute_granularity: unknown value {granularity!r} (allowed: full, selective)"
        )
    out: dict[str, Any] = {"recompute_granularity": granularity}
    if granularity == "full":
        method = opts.get("recompute_method", "uniform")
        if method not in RECOMPUTE_METHODS:
            raise SourceError(f"{what}.recompute_method: unknown value {method!r} (allowed: uniform, block)")
        layers = opts.get("recompute_num_layers", 1)
        if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
            raise SourceError(f"{what}.recompute_num_layers: expected an integer >= 1, got {layers!r}")
        out |= {"recompute_method": method, "recompute_num_layers": layers}
    elif "recompute_method" in opts or "recompute_num_layers" in opts:
        raise SourceError(
            f"{what}: recompute_method and recompute_num_layers apply to recompute_granularity: full"
        )
    return out


def preflight(spec: ModelSpec, base_dir: Path) -> None:
    """Checked without building (building needs torch.distributed): package, preset, config."""
    _megatron()
    recompute(spec)
    megatron_fields(spec)


@contextlib.contextmanager
def runtime(spec: ModelSpec) -> Iterator[None]:
    """torch.distributed and Megatron's model-parallel state for one process (TP=1 here),
    created only where absent and destroyed on exit."""
    import torch
    import torch.distributed as dist

    parallel_state = _megatron()
    tp, pp, ep = tensor_parallel(spec), pipeline_parallel(spec), expert_parallel(spec)
    ranks = tp * pp * ep * data_parallel(spec)
    created_group = False
    created_parallel = False
    if not dist.is_initialized():
        if ranks != 1:
            raise SourceError(
                f"{spec.where}: models.{spec.name}: tensor_parallel {tp} x pipeline_parallel {pp} x "
                f"expert_parallel {ep} x data_parallel {data_parallel(spec)} needs {ranks} processes; "
                "launch the case under torchrun"
            )
        backend = {"cuda": "nccl", "npu": "hccl"}.get(spec.device, "gloo")
        store = dist.HashStore()  # type: ignore[attr-defined]  # in-process store, world size 1
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        created_group = True
    try:
        if not parallel_state.model_parallel_is_initialized():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                parallel_state.initialize_model_parallel(
                    tensor_model_parallel_size=tp,
                    pipeline_model_parallel_size=pp,
                    expert_model_parallel_size=ep,
                )
            created_parallel = True
        elif (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        ) != (tp, pp):
            raise SourceError(
                f"{spec.where}: models.{spec.name}: tensor_parallel {tp} x pipeline_parallel {pp}, but "
                f"the running model-parallel state has "
                f"{parallel_state.get_tensor_model_parallel_world_size()} x "
                f"{parallel_state.get_pipeline_model_parallel_world_size()}"
            )
        from megatron.core.tensor_parallel import random as mc_random

        # Attention always forks the CUDA RNG tracker around its dropout; with dropout 0
        # Megatron's inference tracker (a no-op fork) is exact and needs no CUDA.
        if not torch.cuda.is_available():
            mc_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        yield
    finally:
        if created_parallel:
            parallel_state.destroy_model_parallel()
        if created_group:
            dist.destroy_process_group()


@contextlib.contextmanager
def cpu_workarounds() -> Iterator[None]:
    """megatron-core's CUDA assumptions on a CPU-only torch, answered on the CPU for the
    duration of a call: the public ``pytest_precalign.megatron_cpu`` (rotary embedding's
    ``torch.cuda.current_device``, the RNG tracker, the pipeline schedule). (The causal mask
    is passed explicitly in ``call``, the no-op RNG tracker is set in ``runtime``.)"""
    from ..training import megatron_cpu

    with megatron_cpu():
        yield


@contextlib.contextmanager
def call_context() -> Iterator[None]:
    """Around any direct call of a Megatron module (isolation mode calls layers one by one)."""
    with cpu_workarounds(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core's deprecation notices about tp_group etc.
        yield


def build(spec: ModelSpec, base_dir: Path) -> torch.nn.Module:

    parallel_state = _megatron()
    if not parallel_state.model_parallel_is_initialized():
        raise SourceError(
            f"{spec.where}: models.{spec.name}: megatron models are built inside the source's runtime"
        )
    from ..recording.determinism import torch_dtype

    # megatron-core warns at import and construction about optional packages (apex, TE) and
    # deprecated defaults; none of it concerns the local spec built here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

    f = megatron_fields(spec)
    dtype = torch_dtype("float32" if spec.dtype == "keep" else spec.dtype)  # keep: as it builds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _build_gpt(
            GPTModel, get_gpt_layer_local_spec, TransformerConfig, f, dtype, spec, parallel_state
        )


def _build_gpt(
    gpt_model: Any,
    layer_spec: Any,
    transformer_config: Any,
    f: Mapping[str, Any],
    dtype: Any,
    spec: ModelSpec,
    ps: Any,
) -> torch.nn.Module:
    """The rank's part of the GPTModel: its pipeline stage and its tensor-parallel shard."""
    family = FAMILIES[preset_of(spec)]
    theta, scaling = rope(f)
    options = _config_options(f, dtype, spec, family)
    experts = None
    if family.moe:
        _router_without_te()
        options |= moe_options(f)
        experts = f["num_experts"]
    model = gpt_model(
        transformer_config(**options),
        layer_spec(
            num_experts=experts,
            moe_grouped_gemm=False,
            normalization="RMSNorm",
            qk_layernorm=family.qk_layernorm,
        ),
        vocab_size=f["vocab_size"],
        max_sequence_length=f["max_position_embeddings"],
        parallel_output=False,  # full-vocab logits on every rank, comparable with HF
        share_embeddings_and_output_weights=bool(f["tie_word_embeddings"]),
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=theta,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
    )
    if scaling is not None:
        # GPTModel's rope_scaling fixes low/high_freq_factor and the original context (1, 4,
        # 8192); its own _apply_scaling takes them all, so the config's values are applied here.
        rotary = model.rotary_pos_emb
        rotary.inv_freq = rotary._apply_scaling(rotary.inv_freq, **scaling)
    return model.to(dtype)  # type: ignore[no-any-return]  # the local spec's RMSNorm ignores params_dtype


def _router_without_te() -> None:
    """megatron-core 0.16.1's router gating (``moe_utils.router_gating_linear``) tests
    ``te_general_gemm is not None``, a name its module defines only when Transformer Engine is
    installed: without it, the None it means (the plain matmul path)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _config_options(f: Mapping[str, Any], dtype: Any, spec: ModelSpec, family: Family) -> dict[str, Any]:
    """The TransformerConfig of the model: the family's biases, q/k norms and head size, and
    everything a CPU run of the local spec needs off (fusions, dropout)."""
    import torch

    heads = f["num_attention_heads"]
    return dict(
        num_layers=f["num_hidden_layers"],
        hidden_size=f["hidden_size"],
        ffn_hidden_size=f["intermediate_size"],
        num_attention_heads=heads,
        num_query_groups=f["num_key_value_heads"],
        kv_channels=f["head_dim"] if family.own_head_dim else f["hidden_size"] // heads,
        add_bias_linear=False,
        add_qkv_bias=family.qkv_bias,
        qk_layernorm=family.qk_layernorm,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        normalization="RMSNorm",
        layernorm_epsilon=float(f["rms_norm_eps"]),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
        use_cpu_initialization=True,
        perform_initialization=True,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        tensor_model_parallel_size=tensor_parallel(spec),
        pipeline_model_parallel_size=pipeline_parallel(spec),
        expert_model_parallel_size=expert_parallel(spec),
        pipeline_dtype=dtype,
        sequence_parallel=False,
        **recompute(spec),
    )


def call(module: torch.nn.Module, inputs: Mapping[str, Any]) -> Any:
    """GPTModel(input_ids, position_ids, attention_mask) with an explicit causal mask
    (True = masked), so Megatron does not build its default mask on CUDA."""
    import torch

    ids = inputs["input_ids"]
    s = ids.shape[-1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=ids.device), diagonal=1)[None, None]
    given = inputs.get("attention_mask")
    if given is not None:  # HF convention: 1 = attend; fold key padding into the mask
        mask = mask | (given == 0)[:, None, None, :]
    positions = torch.arange(s, device=ids.device)[None].expand_as(ids)
    with call_context():
        return module(input_ids=ids, position_ids=positions, attention_mask=mask)
