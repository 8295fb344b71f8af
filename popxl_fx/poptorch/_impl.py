"""``poptorch._impl``: the helpers PopTorch's tests reach."""

from __future__ import annotations

from .errors import Error

__all__ = ["createPoptorchError", "isDispatchTracing", "isRunningOnIpu"]


def isDispatchTracing() -> bool:
    """False: models are captured with torch.fx, not PopTorch's dispatcher."""
    return False


def isRunningOnIpu() -> bool:
    """False: code never runs inside PopTorch's dispatcher (torch.fx traces it instead)."""
    return False


def createPoptorchError(message: str) -> Error:
    return Error(message)
