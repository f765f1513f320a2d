"""Driving a case to a ``CaseRun``: live, launched on ranks, or from stored runs.

In: a config case (or two stored runs). Out: a ``CaseRun`` (both traces, the comparison, the
verdicts); the ``ItemOutcome`` each test item comes to is ``reports.outcome``'s.

``case`` (a case end to end), ``live`` (around every live run), ``side`` (one model through
the steps), ``isolation`` (each module run alone on the baseline's inputs), ``launch`` and ``rank_main`` (ranks under
torchrun, merged by ``parallel.merge``), ``grad_sync``, ``tensor_parallel`` (each rank's
weight shard), ``devices``, ``offline`` (``precalign compare``), ``stored_runs`` (writing
sides), ``outcome`` (map, compare, then one call of ``verdict.case_verdict.judge_case``: ``run``
never finishes a verdict itself), ``both_recorded`` (two recordings compared on what both hold).

Training runs: ``contract_check`` (both sides' plans compared before step 0), ``trainers``
(the case trainers, one module each: the tool's loop, a real ``transformers.Trainer``,
megatron-core's own stack; the step skeleton they share), ``envelope_runs`` (the noise envelope's clean reruns), ``update_check`` (each optimizer
step judged on its inputs), ``step_replay`` (the first divergent step replayed from the
baseline's state, the case then judged again with what it found), ``step_boundary`` (stopping a
trainer where a step starts).
"""

from __future__ import annotations
