"""What a case asks of its verdict, as frozen types (no torch): built from the YAML by
``config/`` and judged by in ``verdict/``, so they live below both.

``expectation`` (``Expectation``: a known divergence the verdict must confirm), ``envelope``
(``EnvelopeSpec``: the run verdict's noise-envelope lane), ``coverage``
(``DEFAULT_MIN_COVERAGE``: the share of a phase's records that must be compared).
"""

from __future__ import annotations
