"""``poptorch._logging``: PopTorch's logger and log-level setters."""

from __future__ import annotations

import logging
import sys

__all__ = ["console", "logger", "setLogLevel", "setPopartLogLevel"]

logger = logging.getLogger("poptorch::python")
_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERR": logging.ERROR,
    "OFF": logging.CRITICAL + 1,
}


def setLogLevel(level) -> None:
    """PopTorch's levels (TRACE, DEBUG, INFO, WARN, ERR, OFF, or 0-6) on its logger."""
    if isinstance(level, int):
        level = list(_LEVELS)[min(max(level, 0), 5)]
    if level not in _LEVELS:
        raise ValueError(f"setLogLevel({level!r}): give one of {list(_LEVELS)}.")
    logger.setLevel(_LEVELS[level])


def setPopartLogLevel(level) -> None:
    """Accepted: there is no PopART to log."""


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when it writes (test harnesses
    replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass  # always the current sys.stderr


def console() -> logging.Logger:
    """PopTorch's logger, printing to stderr as PopTorch's does (its handler is added on the
    first message, not at import)."""
    if not any(getattr(h, "_poptorch_console", False) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("[poptorch:python] [%(levelname)s] %(message)s"))
        handler._poptorch_console = True
        logger.addHandler(handler)
    return logger
