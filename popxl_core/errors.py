"""Errors popxl exposes as `popxl.errors`."""

from __future__ import annotations

__all__ = ["UndefinedValue", "OpDataError"]


class OpDataError(ValueError):
    """A kernel met a value its op cannot take (known only at run time, e.g. a label out of
    range); `Session.run` adds the op and its input tensors to the message."""


class UndefinedValue(ValueError):
    """A value was read before it was defined."""
