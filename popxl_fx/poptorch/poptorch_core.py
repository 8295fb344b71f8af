"""``poptorch.poptorch_core``: the names PopTorch's Python code (and its tests) take from the
C++ extension; here only the error types and device queries, in Python."""

from __future__ import annotations

from .errors import Error, RecoverableError, UnrecoverableError
from .session_options import validate_options

__all__ = [
    "Error",
    "RecoverableError",
    "UnrecoverableError",
    "_validateOptions",
    "ipuHardwareVersion",
    "isCompilingWithDispatcher",
]


def ipuHardwareVersion(num_ipus: int = 1) -> int:
    """0: there is no IPU hardware (the simulator is not one)."""
    return 0


def _validateOptions(options: dict) -> None:
    """PopTorch's check of ``Options.toDict()``: an unknown option or value type raises."""
    validate_options(options)


def isCompilingWithDispatcher() -> bool:
    """False: no PopTorch dispatcher is left active (models are captured with torch.fx, which
    ends with the capture)."""
    return False
