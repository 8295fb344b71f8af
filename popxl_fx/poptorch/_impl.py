"""``poptorch._impl``: the helpers PopTorch's tests reach."""

from __future__ import annotations

from . import marks, wrapping
from .errors import Error

__all__ = [
    "_restoreWrapperIfNecessary",
    "createPoptorchError",
    "isDispatchTracing",
    "isRunningOnIpu",
]

# what unpickling and copying a model marked by a training executor call (`wrapping`)
_restoreWrapperIfNecessary = wrapping.restore


def isDispatchTracing() -> bool:
    """False: models are captured with torch.fx, not PopTorch's dispatcher."""
    return False


def isRunningOnIpu() -> bool:
    """True while an executor captures the model's forward (what runs on the IPU), False
    in eager calls, as PopTorch's flag is while it traces."""
    return marks.current() is not None


def createPoptorchError(message: str) -> Error:
    return Error(message)
