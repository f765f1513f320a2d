"""Which model sources exist and which keys each accepts (no torch import: config uses it)."""

from __future__ import annotations

from dataclasses import dataclass

# Keys every model accepts, whatever its source.
COMMON_MODEL_KEYS = ("source", "dtype", "device", "seed", "output", "patch", "weights")


# ``runtime:`` of a factory model: what the tool sets up around building and running it.
# ``megatron``: torch.distributed and megatron-core's parallel state (one process), and the
# model called as megatron-core's GPTModel (``sources/factory.py``).
MEGATRON_RUNTIME = "megatron"
FACTORY_RUNTIMES = (MEGATRON_RUNTIME,)


@dataclass(frozen=True)
class SourceInfo:
    name: str
    builder: str  # "module:function" imported lazily, so the registry costs nothing
    required: tuple[str, ...]
    optional: tuple[str, ...]
    extra: str | None = None  # the pip extra that provides what it needs
    summary: str = ""


SOURCES: dict[str, SourceInfo] = {
    "hf": SourceInfo(
        name="hf",
        builder="pytest_precalign.sources.hf:build",
        required=(),
        optional=("class", "config", "attn_implementation", "pretrained"),
        extra="hf",
        summary="a transformers model class built from a config dict, or a local pretrained dir",
    ),
    "megatron": SourceInfo(
        name="megatron",
        builder="pytest_precalign.sources.megatron:build",
        required=(),
        optional=(
            "preset",
            "config",
            "tensor_parallel",
            "pipeline_parallel",
            "expert_parallel",
            "data_parallel",
            "launch",
            "recompute_granularity",
            "recompute_method",
            "recompute_num_layers",
        ),
        extra="megatron",
        summary="a megatron-core GPTModel (local spec) from a preset and an HF-style config",
    ),
    "factory": SourceInfo(
        name="factory",
        builder="pytest_precalign.sources.factory:build",
        required=("factory",),
        optional=("kwargs", "runtime"),
        summary="'module:function' returning an nn.Module (runtime: megatron for a megatron-core model)",
    ),
}
