"""PopTorch's error types: ``poptorch.Error`` and the two kinds PopTorch derives from it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..capture import EXAMPLE_NOTE

__all__ = ["Error", "RecoverableError", "UnrecoverableError", "eager_errors", "unsupported"]


class Error(RuntimeError):
    """An error raised by the PopTorch API (``poptorch.Error``)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.type = "poptorch_cpp_error"
        self.location = ""


class RecoverableError(Error):
    """An error after which the program may go on (``poptorch.RecoverableError``)."""

    recovery_action = ""


class UnrecoverableError(Error):
    """An error after which the device must be reset (``poptorch.UnrecoverableError``)."""


def unsupported(name: str, why: str) -> Error:
    """The error for a PopTorch API that this simulator cannot provide, naming it and why."""
    return Error(f"{name} is not available in popxl_fx's PopTorch layer: {why}.")


def eager_errors(fn: Callable) -> Callable:
    """``fn`` raising what the model's own code raises as torch raised it: PopTorch runs the
    model's ops as torch does, so its errors carry no note of popxl_fx's capture."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            notes = getattr(exc, "__notes__", None)
            if notes:
                exc.__notes__ = [n for n in notes if not n.startswith(EXAMPLE_NOTE)]
            raise

    return call
