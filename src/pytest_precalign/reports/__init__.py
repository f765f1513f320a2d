"""Verdicts as messages and files (no torch import).

In: a ``CaseRun``'s verdicts. Out: message lines in torch.testing's wording, report.json,
report.html, JUnit properties, ``compare_result.csv``.

``text`` (messages), ``document`` (report.json and its dicts), ``html``, ``chart``, ``tree`` and
``tree_html`` (report.html), ``compare_csv`` (msprobe-style CSV), ``folder`` (a report folder published as one set),
``training_text`` and ``training_chart`` (a training run's verdict in words and its per-step
curves), ``replay_text`` (the replay of its first divergent step in words), ``not_compared_text`` (what it did not compare, in words), ``phase_notes_text`` (a phase's run notes in words: replicas that disagree, partial steps), ``coverage_text`` (a phase's coverage and what fails it for want of evidence, in words), ``overflow_text`` (what a candidate's overflow was seen as, in words), ``expectation_text`` (what a phase was checked against instead of alignment, in words),
``training_evidence_text`` (its evidence, findings and warnings in words; a step's scalars in
``scalar_evidence_text``, the plans' difference in ``contract_evidence_text``, its whole-model
pattern in ``run_pattern_text``, the envelope lane's envelope in ``envelope_text``; a phase's origin claim, the data story's
aside, the first divergence's record choice, in ``origin_text``), ``training_json``
(its report.json block), ``outcome`` (what one test item came to: ``ItemOutcome``, its message, summary line,
report entry and JUnit properties).
"""

from __future__ import annotations
