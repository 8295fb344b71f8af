"""Checks of the arguments users pass to the factories (streams, variables, graph inputs, specs).

PopXL's factories take a popxl dtype and a shape tuple; anything else fails deep inside
PopXL with an AttributeError. Here the same mistakes fail at the call, naming the tensor.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional, Tuple, overload

import numpy as np
import torch

from . import dtypes

__all__ = [
    "check_conversion",
    "check_host_data",
    "checked_dtype",
    "checked_shape",
    "describe_dtype_value",
]


def describe_dtype_value(value: Any) -> str:
    """How a wrong dtype argument reads in a message (numpy and torch dtypes named as such)."""
    if isinstance(value, torch.dtype):
        return f"the torch dtype {value}"
    if isinstance(value, type) and issubclass(value, np.generic):
        return f"the numpy type np.{value.__name__}"
    if isinstance(value, np.dtype):
        return f"the numpy dtype {value}"
    return f"{value!r} ({type(value).__name__})"


def _suggestion(value: Any) -> str:
    try:
        return f"; use popxl.{dtypes.dtype.as_dtype(value).name}"
    except (TypeError, ValueError):
        return ""


# overloads for the type checker: without ``optional`` the result is never None
@overload
def checked_dtype(value: Any, where: str, optional: Literal[False] = False) -> dtypes.dtype: ...


@overload
def checked_dtype(value: Any, where: str, optional: bool) -> Optional[dtypes.dtype]: ...


def checked_dtype(value: Any, where: str, optional: bool = False) -> Optional[dtypes.dtype]:
    """``value`` if it is a popxl dtype (or None when ``optional``); TypeError otherwise."""
    if isinstance(value, dtypes.dtype) or (optional and value is None):
        return value
    raise TypeError(
        f"{where}: expected a popxl dtype such as popxl.float32, got "
        f"{describe_dtype_value(value)}{_suggestion(value)}."
    )


def checked_shape(shape: Any, where: str) -> Tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints; TypeError/ValueError naming ``where``."""
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):
        return shape  # the common case, checked at a fraction of the general path's cost
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        raise TypeError(
            f"{where}: expected a shape tuple, got the int {shape}; write ({int(shape)},)."
        )
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"{where}: expected a shape tuple of ints, got {shape!r}.")
    dims = tuple(shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(
                f"{where}: expected a shape tuple of ints, got {dims!r} "
                f"(dimension {d!r} is a {type(d).__name__})."
            )
        if d < 0:
            raise ValueError(f"{where}: shape {dims} has a negative dimension {int(d)}.")
    return tuple(int(d) for d in dims)


def check_host_data(data: Any, where: str) -> None:
    """Raise unless ``data`` converts to a numeric numpy array (ragged lists, tensors of a graph
    or strings would otherwise fail inside numpy or become an object array)."""
    if isinstance(data, (np.ndarray, torch.Tensor)) and data.dtype != object:
        return
    if type(data).__name__ in ("Tensor", "Variable", "Constant") and hasattr(data, "graph"):
        raise TypeError(
            f"{where}: data is the graph tensor {data!r}; pass host data (a numpy array, "
            "torch tensor or python number), not a popxl.Tensor."
        )
    try:
        arr = np.asarray(data)
    except ValueError as e:
        raise ValueError(
            f"{where}: data is ragged or not rectangular ({e}); every row needs the same length."
        ) from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise TypeError(
            f"{where}: data of type {type(data).__name__} is not numeric (numpy makes it "
            f"{arr.dtype}); pass numbers, a numpy array or a torch tensor."
        )


def _scalar_kept(data: Any, arr: np.ndarray) -> bool:
    """True where `check_conversion` would find nothing to report, for the commonest case (a
    Python int or float made a scalar of its own kind: the optimizers' and operators'
    constants), decided without numpy's machinery; False sends the case down the full check."""
    if arr.ndim or type(data) not in (int, float):
        return False
    kind = "i" if type(data) is int else "f"
    if arr.dtype.kind != kind:
        return False
    value = arr.item()
    if kind == "i":
        return value == data
    return not math.isfinite(data) or math.isfinite(value)


def check_conversion(data: Any, arr: np.ndarray, where: str, downcast: bool = False) -> None:
    """Raise if converting host ``data`` to ``arr``'s dtype changed a value: a fraction or an
    out-of-range number into an integer type (numpy would truncate or wrap it), or a finite
    number into a float type that makes it inf. PopXL converts silently; we refuse.

    ``downcast``: the conversion is PopXL's implicit 64-bit downcast (no dtype given). Its
    float64 -> float32 overflow to inf is let through as PopXL documents it (and Graphcore's
    own examples pass uninitialised ``np.ndarray(shape)`` data); an int64 that wraps is not.
    """
    if _scalar_kept(data, arr):
        return
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    src = np.asarray(data)
    if src.size > 1 and not any(src.strides) and not any(arr.strides):
        # a broadcast fill: one value, checked once (the full array is never materialised)
        src, arr = src.flat[0:1], arr.flat[0:1]
    if src.dtype == arr.dtype or src.dtype.kind not in "biuf" or arr.dtype.kind not in "iuf":
        return
    if downcast and arr.dtype.kind == "f":
        return
    with np.errstate(invalid="ignore", over="ignore"):
        if arr.dtype.kind == "f":
            bad = np.isfinite(src) & ~np.isfinite(arr)
        else:
            back = arr.astype(src.dtype)
            bad = (back != src) | (~np.isfinite(src) if src.dtype.kind == "f" else False)
    if np.any(bad):
        at = np.unravel_index(int(np.argmax(bad)), src.shape)
        value, became = src[at].item(), arr.reshape(src.shape)[at].item()
        raise ValueError(
            f"{where}: the value {value!r} does not fit {arr.dtype} (it would become "
            f"{became!r}); use a dtype that holds it, or convert the value explicitly."
        )
