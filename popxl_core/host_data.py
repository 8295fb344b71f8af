"""Host data to numpy: popxl's `to_numpy` (copy, C order, 64-bit types downcast)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from .dtypes import dtype

__all__ = ["to_numpy"]


def to_numpy(data: Any, dtype: Optional[dtype] = None, downcast: bool = True) -> np.ndarray:
    """Host data as a C-contiguous numpy array, downcasting 64-bit types like popxl."""
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    arr = np.array(data, copy=True)
    if dtype is not None:
        with np.errstate(all="ignore"):  # check_conversion reports values that change
            arr = arr.astype(dtype.as_numpy(), copy=False)
    elif downcast:
        arr = _downcast(arr)
    # ascontiguousarray turns 0-d arrays into (1,): keep scalars as shape ()
    return np.ascontiguousarray(arr).reshape(arr.shape)


def _downcast(arr: np.ndarray) -> np.ndarray:
    table = {
        np.dtype(np.int64): np.int32,
        np.dtype(np.uint64): np.uint32,
        np.dtype(np.float64): np.float32,
    }
    target = table.get(arr.dtype)
    return arr.astype(target) if target is not None else arr
