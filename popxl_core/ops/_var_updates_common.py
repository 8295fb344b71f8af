"""Checks and scalar handling shared by the var_updates op families."""

from __future__ import annotations

import numpy as np
import torch

from ..tensor import Tensor, TensorSpec

__all__ = ["Factor", "check_float", "check_scalar", "f16", "f32", "factor_inputs", "in_dtype_of"]


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


Factor = float | Tensor


def in_dtype_of(t: torch.Tensor):
    """Casts to the accumulator's dtype (IPU var-updates compute in it)."""
    return lambda v: v.to(t.dtype)


def factor_inputs(f: Factor | None) -> tuple[float | None, list[Tensor]]:
    """A float factor is an attribute; a Tensor factor is an extra op input."""
    if isinstance(f, Tensor):
        return None, [f]
    return (None if f is None else float(f)), []


def f16(value: float) -> torch.Tensor:
    """A float16 sample value, rounded through float32 as a float factor is."""
    return torch.tensor(np.float32(value), dtype=torch.float16)
