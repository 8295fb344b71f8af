"""PopTorch's device-side control flow, ``poptorch.for_loop`` and ``poptorch.cond``.

The traced program unrolls a loop and runs both branches of a computed condition, so it
computes what PopTorch's device loop and branch compute. PopTorch's own checks apply: the
inputs are lists of tensors, passed by value, and neither op can be trained through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import marks
from .errors import Error

__all__ = ["cond", "for_loop"]

_TENSORS = (torch.Tensor, torch.fx.Proxy)  # a traced tensor is a Proxy


def _inference_only(name: str) -> None:
    """PopTorch builds no gradient for its loop and branch subgraphs."""
    recording = marks.current()
    if recording is not None and recording.training:
        raise Error(f"poptorch.{name}() is only supported in inference.")


def _check_list(inputs, what: str) -> None:
    if not isinstance(inputs, list):
        raise ValueError(f"poptorch.{what} to be a list of tensors. (Object is not list)")


def for_loop(count: int, body: Callable, inputs: Sequence[torch.Tensor]) -> list:
    """Apply ``body`` ``count`` times, each time to the last outputs (PopTorch's device
    loop; here the traced program repeats the body)."""
    _check_list(inputs, "for_loop expects input tensors (inputs)")
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, _TENSORS):
            raise ValueError(
                "poptorch.for_loop expects input tensors (inputs) to be a list of tensors. "
                f"(Object contained in list at index {index} is not torch.tensor)"
            )
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"for_loop(count={count!r}): give a non-negative int.")
    _inference_only("for_loop")
    values = list(inputs)
    for _ in range(count):
        # Each iteration's inputs are copies (PopTorch passes them by value), so an in-place
        # update in the body never reaches the caller's tensors.
        values = _as_list(body(*[v.clone() for v in values]))
        if len(values) != len(inputs):
            raise ValueError(
                f"for_loop: the body returns {len(values)} tensors but takes {len(inputs)}; "
                "it must return one tensor per input."
            )
    return values


def cond(
    condition: torch.Tensor,
    then_body: Callable,
    then_inputs: Sequence,
    else_body: Callable,
    else_inputs: Sequence,
) -> list:
    """``then_body(*then_inputs)`` where ``condition`` is true, else ``else_body(...)``.

    A condition known at capture (a Python bool, a constant tensor) picks its branch. A
    condition computed in the model runs both branches and selects each output with
    ``torch.where``: the values are those of the branch taken, as PopTorch's device-side
    branch gives them."""
    _check_list(then_inputs, "cond expects then_inps and else_inps tensors")
    _check_list(else_inputs, "cond expects then_inps and else_inps tensors")
    _inference_only("cond")
    if not isinstance(condition, torch.fx.Proxy):
        return _as_list(then_body(*then_inputs) if bool(condition) else else_body(*else_inputs))
    taken, other = _as_list(then_body(*then_inputs)), _as_list(else_body(*else_inputs))
    if len(taken) != len(other):
        raise ValueError(
            f"poptorch.cond: then_body returns {len(taken)} tensors and else_body "
            f"{len(other)}; both branches must return the same number of tensors."
        )
    return [torch.where(condition, a, b) for a, b in zip(taken, other)]


def _as_list(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]
