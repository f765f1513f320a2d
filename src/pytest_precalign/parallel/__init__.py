"""Stored runs read, and distributed runs compared across parallel layouts: a multi-rank
side (our rank folders with ``parallel`` manifests, launched ranks, or an msprobe dump with a
layout given) merged lazily into one canonical trace (TP=1, one stage). No torch import.

In: a stored run's folder (and a layout where its files carry none). Out: one ``Trace``.

``stored`` (the one reader of stored runs: a side, every (step, rank), one rank of one step),
``layout`` (sizes, rank order, the one validator of the manifest's ``parallel`` block, where
the rank folders are), ``rules`` (how Megatron shards each tensor, as data), ``dtensor_rules`` (the rules of a
DTensor tensor-parallel run, from the plan its recording wrote), ``merge`` (the
one merge: ranks -> records, TP/PP/VPP/DP/EP), ``store`` (the lazy merged tensors), ``steps``
(several steps as one trace), ``sides`` (loading a multi-rank side), ``joined_parts`` (a run
resumed into a new root joined with its first part), ``msprobe_ranks``
(msprobe dumps), ``data_split`` (data-parallel replicas' micro-batches as one process's records),
``dp_join`` (replicas that trained on different rows joined along the batch; sides that split
the batch otherwise), ``dp_scalars`` (their per-step scalars as the global step's).
"""

from __future__ import annotations
