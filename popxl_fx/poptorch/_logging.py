"""``poptorch._logging``: PopTorch's logger and log-level setters.

As PopTorch's, the logger starts at the level named by ``POPTORCH_LOG_LEVEL`` (WARN when
unset) and prints ``[time] [poptorch::python] [level] message`` lines to stderr.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys

__all__ = ["logger", "setLogLevel", "setPopartLogLevel"]

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


class _Formatter(logging.Formatter):
    """PopTorch's line: ``[12:34:56.789] [poptorch::python] [warning] message``."""

    def __init__(self) -> None:
        super().__init__("[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s")

    def formatTime(self, record, datefmt=None) -> str:
        when = datetime.datetime.fromtimestamp(record.created)
        return f"{when:%H:%M:%S}.{int(record.msecs):03d}"

    def format(self, record) -> str:
        record = logging.makeLogRecord({**record.__dict__, "levelname": record.levelname.lower()})
        return super().format(record)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (pytest swaps it for each test)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        del value  # always the current sys.stderr


def _configure() -> None:
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_Formatter())
        logger.addHandler(handler)
    setLogLevel(os.environ.get("POPTORCH_LOG_LEVEL", "WARN"))
