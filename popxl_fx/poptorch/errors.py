"""PopTorch's error types: ``poptorch.Error`` and the two kinds PopTorch derives from it."""

from __future__ import annotations

__all__ = ["Error", "RecoverableError", "UnrecoverableError", "unsupported"]


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
