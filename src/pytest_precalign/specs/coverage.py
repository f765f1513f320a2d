"""How much of a phase must be compared at all (``verdict/coverage`` measures it)."""

from __future__ import annotations

# Below half the baseline's outputs paired, the compare says more about the mapping (or the
# dumps' levels) than about the model: the README explains the default.
DEFAULT_MIN_COVERAGE = 0.5
