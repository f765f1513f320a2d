"""Presets shipped with the package: mappings (``preset:NAME``) and msprobe layer_mapping files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
