"""Verdicts (no torch import): is a phase aligned, and where does it first diverge?

In: a ``Comparison`` of two traces. Out: a ``PhaseVerdict`` per phase (first divergence,
origin or propagated, NaN/Inf, coverage) and a case story; what a case asks of them (a
known divergence, the envelope, the coverage floor) is in ``specs/``.

``case_verdict`` (``judge_case``: every verdict of a case in one call, the only one ``run``
makes), ``case_facts`` (the manifest facts a verdict needs, read once), ``phase`` (the
verdict), ``phase_notes`` (what a side's run notes make of it: grads missing, replicas that
disagree, partial steps), ``divergence_start`` (where the sides start to differ), ``evidence`` (what an origin
claim rests on), ``origin_facts`` (that claim and the case origin, as facts), ``coverage``, ``overflow``, ``phase_checks`` (what a phase was checked against instead of alignment), ``story`` (the case's origin across phases).

Training runs: ``training_run`` (the first divergent step, what and where), ``training_contract``
(the two sides' plans compared before step 0), ``training_scalars`` (one step's scalars),
``training_records`` (each step's per-layer evidence), ``model_output`` (the grad arriving at
the model's output, made by a loss computed outside it), ``grads_one_sided`` (parameter grads
one side has and the other not), ``training_envelope`` (the noise
envelope lane, and the envelope a verdict judged by, as facts), ``training_traces`` (the verdict of two traces), ``training_settings`` (adapters and precision
judged before step 0; a plan difference told in the framework's own argument names),
``frozen_params`` (parameters both sides freeze, checked unchanged instead of judged),
``replay_finding`` (what the replay of the first divergent step found, or why it did not run),
``not_compared`` (what the run verdict did not compare, as facts), ``run_findings`` (what the run
could not pair and what passed only by the table's opt-in, as facts), ``run_evidence`` (why the
run verdict names its first divergence, as facts), ``run_patterns`` (what its first divergence
looks like over the whole model, as facts), ``scalar_evidence`` (why a step's scalars
differ, as facts), ``contract_evidence`` (why the plans differ before step 0, as facts),
``side_values`` (each side's value a fact states: the bases of those facts),
``dp_replicas`` (data-parallel replicas that disagree: the rank named), ``dp_rows`` (the DP
rank whose rows of a joined record differ), ``tp_ranks`` (the TP rank whose partial sum of a
row-parallel module, or whose local shard of a sharded weight's grad, differs, or why it cannot
be told), ``non_data_inputs``
(masks, positions and caches set aside or named in the origin walk).
"""

from __future__ import annotations
