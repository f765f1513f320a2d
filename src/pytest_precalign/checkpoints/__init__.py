"""Checkpoints read from disk (read-only) and compared tensor by tensor.

In: checkpoint folders (HF ``save_pretrained``, Megatron legacy, megatron-core ``torch_dist``).
Out: one full-precision state per checkpoint; a comparison through a mapping; a model loaded
from one.

``hf``, ``megatron_legacy``, ``megatron_dist`` (readers), ``sharding`` (TP slices and their
gather), ``compare`` (``precalign check-weights``), ``load_into`` (``weights: {load:}``), ``trust`` (what a
pickled checkpoint may hold unless the user trusts it).
"""

from __future__ import annotations
