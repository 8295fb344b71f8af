"""The host data of a new variable or constant: its checks and conversion to a host array
(float8 data as bits, converted with log2_scale).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from . import dtypes, fp8_utils
from .arg_checks import check_conversion, check_host_data, checked_dtype
from .host_data import to_numpy

__all__ = ["check_data", "host_array", "grouped_data"]


def grouped_data(data, replica_grouping, where: str):
    """``data`` for a variable with ``replica_grouping``: an np.memmap with a non-constant
    grouping becomes a copy, as PopXL falls back to (the memmap's file cannot be the host
    buffer of groups that are not evenly strided), and the user is told on stderr, where
    PopART's logger writes its warnings."""
    if not isinstance(data, np.memmap) or replica_grouping is None or replica_grouping.is_const:
        return data
    print(
        f"popxl warning: {where}: you have passed np.memmap data and a non-const replica "
        f"grouping ({replica_grouping}); the data is copied into memory and the memmap file "
        "is not updated by weights_to_host.",
        file=sys.stderr,
    )
    return np.array(data)


def host_array(data, dt, downcast, log2_scale, nan_on_overflow, where):
    """``(host array, dtype)`` of a variable's or constant's data; float8 data is uint8 bits
    (or a popxl float8 array) or float values converted with ``log2_scale`` (default 0) and
    ``nan_on_overflow`` (default True: out-of-range values become NaN, never clipped)."""
    arr = np.asarray(data) if not isinstance(data, torch.Tensor) else None
    if dt is None and arr is not None and arr.dtype in _FP8_BY_NP:
        dt = _FP8_BY_NP[arr.dtype]
    if dt is not None and dt.name.startswith("float8"):
        return _fp8_host_array(data, dt, log2_scale, nan_on_overflow, where), dt
    if log2_scale is not None or nan_on_overflow is not None:
        raise ValueError(f"{where}: log2_scale and nan_on_overflow apply to float8 data only.")
    out = to_numpy(data, dt, downcast)
    check_conversion(data, out, where, downcast=dt is None)
    return out, dt


def _fp8_host_array(data, dt, log2_scale, nan_on_overflow, where) -> np.ndarray:
    arr = np.asarray(data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else data)
    if arr.dtype.kind == "f":
        bits = fp8_utils.host_pow2scale_cast_to_fp8(
            arr,
            dt,
            0 if log2_scale is None else log2_scale,
            True if nan_on_overflow is None else nan_on_overflow,
        )
    elif arr.dtype in (np.dtype(np.uint8), dt.as_numpy()):
        if log2_scale is not None:
            raise ValueError(
                f"{where}: log2_scale applies when float data is converted to "
                f"{dt.name}, not to float8 bits."
            )
        bits = np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape)
    else:
        raise TypeError(
            f"{where}: {dt.name} data must be float values (converted with "
            f"log2_scale) or uint8 bits, got {arr.dtype}."
        )
    return np.array(bits, copy=True).view(dt.as_numpy()).reshape(arr.shape)


def check_data(data, dt, where: str) -> None:
    checked_dtype(dt, where, optional=True)
    check_host_data(data, where)


_FP8_BY_NP = {
    dtypes.np_dtype_float8_143: dtypes.float8_143,
    dtypes.np_dtype_float8_152: dtypes.float8_152,
}
