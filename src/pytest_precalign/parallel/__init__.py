"""Distributed runs compared across parallel layouts: a multi-rank side (our rank folders
with ``parallel`` manifests, or an msprobe dump with a layout given) merged lazily into one
canonical trace (TP=1, one stage). No torch import.

``layout`` (sizes, rank order, where the rank folders are), ``rules`` (how Megatron shards
each tensor, as data), ``merge`` (ranks -> records), ``store`` (the lazy merged tensors),
``sides`` (loading a side), ``msprobe_ranks`` (msprobe dumps).
"""

from __future__ import annotations
