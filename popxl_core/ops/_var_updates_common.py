"""Checks and scalar handling shared by the var_updates op families."""

from __future__ import annotations

import torch

from ..tensor import TensorSpec

__all__ = ["check_float", "check_scalar", "f32"]


def check_float(what: str, s: TensorSpec) -> None:
    if not s.dtype.is_floating_point:
        raise TypeError(f"{what} must be a floating point tensor, got {s.dtype.name}")


def check_scalar(what: str, s: TensorSpec) -> None:
    """Optimiser values given as tensors hold one float."""
    check_float(what, s)
    if s.nelms != 1:
        raise ValueError(f"{what} must hold a single value, got shape {s.shape}")


def f32(value: float | torch.Tensor) -> torch.Tensor:
    """A float32 scalar: float factors are rounded to float32 first, like the IPU does, so
    ``1 - f`` is computed in float32 (0.999 -> 1 - 0.999f = 0.00099998713...)."""
    if isinstance(value, torch.Tensor):
        return value.float().reshape(())
    return torch.tensor(value, dtype=torch.float32)
