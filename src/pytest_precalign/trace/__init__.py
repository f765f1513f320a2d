"""trace."""

from __future__ import annotations
