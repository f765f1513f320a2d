"""recording."""

from __future__ import annotations
