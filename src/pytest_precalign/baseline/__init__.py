"""baseline."""

from __future__ import annotations
