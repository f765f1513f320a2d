"""``precalign calibrate``: a case's noise floor measured, written as a tolerance table.

In: a config case. Out: a tolerance table YAML whose every rule says how it was measured.

``measure`` (the baseline against perturbed copies of itself: float64, attention
implementation, seeds), ``rules`` (measured noise -> rules with a ``why``, amplification, the
command and its files).
"""

from __future__ import annotations
