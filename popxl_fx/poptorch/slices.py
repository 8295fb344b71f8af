"""``poptorch.dynamic_slice`` / ``dynamic_update``: a window of constant size at a start
tensor, with PopTorch's argument checks and error texts.

Called in a captured model with a start computed there, each becomes one node of
`popxl_fx.lowerings.dynamic` (the start is read on the device); otherwise it computes what
PopTorch's CPU kernel does, torch's ``slice`` / ``slice_scatter`` at the start's value.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..lowerings import dynamic
from .errors import Error

__all__ = ["dynamic_slice", "dynamic_update"]

_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


def _traced(*xs) -> fx.Proxy | None:
    return next((x for x in xs if isinstance(x, fx.Proxy)), None)


def _is_tensor(x) -> bool:
    return isinstance(x, (torch.Tensor, fx.Proxy))


def _check_size(size: int) -> None:
    """PopTorch's checks of a dynamic window's size, made when it compiles."""
    if size == 0:
        raise Error("The start and end of a slice must be different.")
    if size < 0:
        raise Error("Taking a slice of a tensor with the end less than the start is not supported.")


def _check_slice(tensor, dim, start, size, step) -> None:
    if not _is_tensor(tensor):
        raise Error(
            f"dynamic_slice must take a torch.tensor input. {type(tensor)} is not supported."
        )
    if not isinstance(dim, int):
        raise Error("Dimension must be an integer.")
    if not _is_tensor(start):
        raise Error(
            "Slice start argument to dynamic_slice must be a torch.tensor. "
            f"{type(start)} is not supported."
        )
    if not isinstance(size, int):
        raise Error("Size must be an integer.")
    if not isinstance(step, int):
        raise Error("Step must be an integer.")


def dynamic_slice(tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int):
    """``tensor``'s elements ``start, start + step, ...`` below ``start + size`` on ``dim``."""
    _check_slice(tensor, dim, start, size, step)
    proxy = _traced(tensor, start)
    if proxy is None:
        return dynamic.dynamic_slice(tensor, dim, start, size, step)
    _check_size(size)
    if step < 1:
        raise Error("Slicing step must be at least 1")
    length = tensor.shape[dim]
    if length % size != 0:
        raise Error(
            f"The size of the slice ({size}) must be a factor of the slicing dimension ({length})."
        )
    args = (tensor, dim, start, size, step)
    return proxy.tracer.create_proxy("call_function", dynamic.dynamic_slice, args, {})


def _check_update(input, src, dim, start, size, traced: bool) -> None:
    if not _is_tensor(input):
        raise Error(
            f"dynamic_update must take a torch.tensor input. {type(input)} is not supported."
        )
    if not isinstance(dim, int):
        raise Error("Dimension must be an integer.")
    if not _is_tensor(start):
        raise Error(
            "Slice start argument to dynamic_update must be a torch.tensor. "
            f"{type(start)} is not supported."
        )
    if not _is_tensor(src):
        raise Error(
            f"Src argument to dynamic_update must be a torch.tensor. {type(src)} is not supported."
        )
    if not isinstance(size, int):
        raise Error("Size must be an integer.")
    if input.dim() != src.dim():
        raise Error(
            f"input and src tensors must have same dimensionality. ({input.dim()}) vs ({src.dim()})"
        )
    if input.dtype != src.dtype:
        a, b = _held(input.dtype, traced), _held(src.dtype, traced)
        raise Error(f"input and src tensor must have same dtype. ({a} vs {b})")


def _held(dtype: torch.dtype, traced: bool) -> torch.dtype:
    """The dtype PopTorch names: on the IPU, 64-bit inputs are held in 32 bits."""
    return _NARROW.get(dtype, dtype) if traced else dtype


def dynamic_update(
    input: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
):
    """A copy of ``input`` with ``src`` written at ``start, ..., start + size - 1`` on ``dim``."""
    proxy = _traced(input, src, start)
    _check_update(input, src, dim, start, size, proxy is not None)
    if proxy is None:
        return dynamic.dynamic_update(input, src, dim, start, size)
    _check_size(size)
    args = (input, src, dim, start, size)
    return proxy.tracer.create_proxy("call_function", dynamic.dynamic_update, args, {})
