"""verdict."""

from __future__ import annotations
