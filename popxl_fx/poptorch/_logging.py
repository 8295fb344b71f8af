"""``poptorch._logging``: PopTorch's logger and log-level setters."""

from __future__ import annotations

import logging
import sys

__all__ = ["logger", "setLogLevel", "setPopartLogLevel"]

logger = logging.getLogger("poptorch::python")


class _Stderr(logging.StreamHandler):
    """PopTorch's console handler: its lines on the stderr of the moment (so captured output
    holds them), as ``[time] [poptorch::python] [level] message``."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


if not any(isinstance(h, _Stderr) for h in logger.handlers):  # once, if reloaded
    _console = _Stderr()
    _console.setFormatter(logging.Formatter("[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s"))
    logger.addHandler(_console)
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
