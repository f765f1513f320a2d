"""Verdicts (no torch import): is a phase aligned, and where does it first diverge?

In: a ``Comparison`` of two traces. Out: a ``PhaseVerdict`` per phase (first divergence,
origin or propagated, NaN/Inf, coverage) and a case story.

``phase`` (the verdict), ``divergence_start`` (where the sides start to differ), ``evidence``
(what an origin claim rests on), ``coverage``, ``overflow``, ``expectation`` (a known
divergence a case expects), ``story`` (the case's origin across phases).
"""

from __future__ import annotations
