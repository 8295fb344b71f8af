"""Host data to numpy: popxl's `to_numpy` (copy, C order, 64-bit types downcast)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from . import dtypes
from .dtypes import dtype

__all__ = ["is_fill", "to_numpy", "host_to_torch", "torch_to_host"]

# float8 host arrays (structured uint8) <-> torch float8 tensors with the same bits
_FP8_TO_TORCH = {
    dtypes.np_dtype_float8_143: torch.float8_e4m3fnuz,
    dtypes.np_dtype_float8_152: torch.float8_e5m2fnuz,
}
_FP8_TO_NP = {t: n for n, t in _FP8_TO_TORCH.items()}


def host_to_torch(arr: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing ``arr``'s memory (float8 arrays as torch float8 tensors)."""
    fp8 = _FP8_TO_TORCH.get(arr.dtype)
    if fp8 is None:
        return torch.from_numpy(arr)
    bits = np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape)
    return torch.from_numpy(bits).view(fp8)


def torch_to_host(t: torch.Tensor) -> np.ndarray:
    """A numpy array sharing ``t``'s memory (torch float8 tensors as popxl float8 arrays)."""
    fp8 = _FP8_TO_NP.get(t.dtype)
    if fp8 is None:
        return t.numpy()
    return t.view(torch.uint8).numpy().view(fp8).reshape(tuple(t.shape))


def to_numpy(data: Any, dtype: Optional[dtype] = None, downcast: bool = True) -> np.ndarray:
    """Host data as a C-contiguous numpy array, downcasting 64-bit types like popxl."""
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    if is_fill(data):
        return _fill(data, dtype, downcast)
    if isinstance(data, np.memmap):
        return _checked_memmap(data, dtype, downcast)
    arr = np.array(data, copy=True)
    if dtype is not None and dtype.name.startswith("float8") and arr.dtype != dtype.as_numpy():
        # a plain astype would store the values' low bytes as float8 bits: refuse
        raise TypeError(
            f"{arr.dtype} data cannot be cast to {dtype.name} here: convert it with "
            "popxl.fp8_utils.host_pow2scale_cast_to_fp8 (uint8 bits) and view those as "
            f"popxl.dtypes.np_dtype_{dtype.name}, or pass it to popxl.variable / constant."
        )
    if dtype is not None:
        with np.errstate(all="ignore"):  # check_conversion reports values that change
            arr = arr.astype(dtype.as_numpy(), copy=False)
    elif downcast:
        arr = _downcast(arr)
    # ascontiguousarray turns 0-d arrays into (1,): keep scalars as shape ()
    return np.ascontiguousarray(arr).reshape(arr.shape)


def _checked_memmap(data: np.memmap, dtype: Optional[dtype], downcast: bool) -> np.memmap:
    """A memmap is used as it is (PopXL keeps it as the variable's host buffer, so a large
    model's weights stay on disk): it is never cast, copied into C order or downcast. The
    messages begin as PopXL's (scripts match on them)."""
    head = "When passing a memory-mapped NumPy array,"
    if dtype is not None and np.dtype(dtype.as_numpy()) != data.dtype:
        raise ValueError(
            f"{head} the `dtype` parameter must be None or the memmap's own dtype "
            f"({data.dtype}), got {dtype}: a memmap is used without a copy. Create the memmap "
            "with that dtype, or pass np.array(data)."
        )
    if not data.flags.c_contiguous:
        raise ValueError(
            f"{head} it must already be in C-ordered (row-major) layout: it is used as the "
            "host buffer as it is. Make the memmap C-ordered or pass np.ascontiguousarray(data)."
        )
    if downcast and data.dtype in _DOWNCAST:
        raise ValueError(
            f"{head} the dtype {dtype} is not supported, as it requires downcasting "
            f"({data.dtype} -> {np.dtype(_DOWNCAST[data.dtype])}), which would copy it. Store "
            "the memmap as a 32-bit type, or pass downcast=False."
        )
    return data


def is_fill(data) -> bool:
    """A broadcast of one value (``np.broadcast_to(0.0, shape)``): all strides 0."""
    return isinstance(data, np.ndarray) and data.size > 1 and not any(data.strides)


def _fill(data: np.ndarray, dtype: Optional[dtype], downcast: bool) -> np.ndarray:
    """A fresh read-only broadcast of the one value: a huge constant-filled variable costs no
    host memory until a Session attaches, so planning (and an OOM error) comes first."""
    one = np.array(data.flat[0], dtype=data.dtype)
    with np.errstate(all="ignore"):  # check_conversion reports values that change
        if dtype is not None:
            one = one.astype(dtype.as_numpy())
        elif downcast:
            one = _downcast(one)
    return np.broadcast_to(one, data.shape)


# popxl's downcasts of 64-bit host data
_DOWNCAST = {
    np.dtype(np.int64): np.int32,
    np.dtype(np.uint64): np.uint32,
    np.dtype(np.float64): np.float32,
}


def _downcast(arr: np.ndarray) -> np.ndarray:
    target = _DOWNCAST.get(arr.dtype)
    return arr.astype(target) if target is not None else arr
