"""RuntimeCheck: a condition checked each time the program runs (torch's ``torch._check``).

A static program cannot branch on data, but it can stop: ``runtime_check(cond, message)``
raises `RuntimeCheckError` when any element of ``cond`` is false at run time. The torch
frontend makes one from a model's guard such as ``if labels.max() >= vocab: raise ...``, so
that bad data still stops the step before anything is updated.
"""

from __future__ import annotations

from typing import Any, Hashable

import torch

from .. import dtypes
from ..tensor import Tensor
from .registry import OpDef, create_op, no_cost, register

__all__ = ["RuntimeCheckError", "runtime_check"]


class RuntimeCheckError(RuntimeError):
    """A `runtime_check` found its condition false; ``tag`` is what its maker passed."""

    def __init__(self, message: str, tag: Hashable = None) -> None:
        super().__init__(message)
        self.tag = tag


def _kernel(cond: torch.Tensor, message: str, tag: Any) -> None:
    if not bool(cond.all()):
        raise RuntimeCheckError(message, tag)


RUNTIME_CHECK = register(
    OpDef(
        "RuntimeCheck",
        lambda ins, **attrs: [],
        _kernel,
        cost=no_cost,
        side_effect=True,  # nothing reads it: it must run all the same
        tested_by="tests/test_fx_guards.py::test_runtime_check_op",
    )
)


def runtime_check(cond: Tensor, message: str, tag: Hashable = None) -> None:
    """Raise `RuntimeCheckError(message, tag)` when the program runs and any element of the
    bool tensor ``cond`` is false.

    Example:
        >>> # ops.runtime_check(ops.less(labels, vocab), "labels must be below the vocabulary")
    """
    if cond.dtype != dtypes.bool:
        raise TypeError(f"runtime_check takes a bool condition, got {cond.dtype.name}.")
    create_op(RUNTIME_CHECK, [cond], {"message": message, "tag": tag})
