"""Record pairs under a tolerance table (no torch import).

In: two traces (the candidate already in the baseline's names) and a ``ToleranceTable``.
Out: a ``Comparison``: one pair per record with its status, evidence and metric values.

``pairs`` (trace against trace), ``tolerances`` (tables, rules, the one loader
``load_table``), ``metrics`` (named metrics over a tensor pair), ``fused_pass`` (everything a
pair needs in one pass), ``forked_jobs`` (compare jobs in forked workers), ``op_pairing`` (op
records), ``moe_tokens`` (expert rows keyed by token), ``workers`` (how many workers compare
a case's pairs: ``PRECALIGN_COMPARE_THREADS``, else the cores free now).
"""

from __future__ import annotations
