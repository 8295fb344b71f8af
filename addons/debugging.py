"""Debug printing that a log level switches on or off (env ``MODEL_LOG_LEVEL``, default INFO).

`print_tensor` adds an ``ops.print_tensor`` (printed to stderr every time the op runs) only
when ``level`` is at or above ``MODEL_LOG_LEVEL``; otherwise it adds nothing and returns its
input, so the program is the same as without it.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import popxl_core
from popxl_core import Tensor, ops

__all__ = ["print_tensor", "print_text"]


def _enabled(level: str) -> bool:
    threshold = os.environ.get("MODEL_LOG_LEVEL", "INFO")
    return _level_number(level) >= _level_number(threshold)


def _level_number(name: str) -> int:
    number = logging.getLevelName(str(name).upper())
    if not isinstance(number, int):
        raise ValueError(
            f"Unknown log level {name!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL."
        )
    return number


def print_tensor(t: Tensor, *args, level: str = "DEBUG", **kwargs) -> Tensor:
    """``ops.print_tensor(t, *args, **kwargs)`` when ``level`` is enabled, else ``t``."""
    if _enabled(level):
        return ops.print_tensor(t, *args, **kwargs)
    return t


def print_text(text: str, num: Optional[float] = None, level: str = "DEBUG") -> None:
    """Print ``text`` (and ``num``, or 0) on the device when ``level`` is enabled."""
    if _enabled(level):
        ops.print_tensor(popxl_core.constant(0 if num is None else num), title=text)
