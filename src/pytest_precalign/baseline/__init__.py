"""Stored baselines for framework upgrades (``--align-baseline DIR``, ``precalign record``).

In: a case and its config; a baseline folder. Out: the case's verdict against what was stored,
or a folder written (one side's trace, its weights and environment). Torch only when a side
is recorded.

``store`` (the only module that reads and writes baselines), ``gate`` (the plugin's per-case
check), ``record_side`` (one side run alone with known weights), ``command``
(``precalign record``), ``variants`` (baselines keyed by environment), ``messages`` (what
was written or changed, and how to accept it).
"""

from __future__ import annotations
