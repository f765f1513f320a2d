"""Driving a case to a ``CaseRun``: live, launched on ranks, or from stored runs.

In: a config case (or two stored runs). Out: a ``CaseRun`` (both traces, the comparison, the
verdicts) and the ``ItemOutcome`` each test item comes to.

``case`` (a case end to end), ``live`` (around every live run), ``side`` (one model through
the steps), ``isolation`` (per-module replay), ``launch`` and ``rank_main`` (ranks under
torchrun, merged by ``parallel.merge``), ``grad_sync``, ``tensor_parallel`` (each rank's
weight shard), ``devices``, ``offline`` (``precalign compare``), ``stored_runs`` (writing
sides), ``outcome`` (map, compare, judge).
"""

from __future__ import annotations
