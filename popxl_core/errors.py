"""Errors popxl exposes as `popxl.errors`."""

from __future__ import annotations

__all__ = ["UndefinedValue"]


class UndefinedValue(ValueError):
    """A value was read before it was defined."""
