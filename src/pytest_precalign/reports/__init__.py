"""reports."""

from __future__ import annotations
