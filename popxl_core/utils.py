"""Host-side helpers popxl exposes as `popxl.utils`."""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch

from .device import to_device_info as _to_device_info  # noqa: F401 (PopXL's private name)
from .fp8_utils import host_pow2scale_cast_to_fp8
from .host_data import torch_to_host

__all__ = ["to_numpy", "downcast_np_dtypes", "table_to_string", "host_pow2scale_cast_to_fp8"]

# the numpy dtypes PopXL narrows when no dtype is given (a dict in PopXL too)
downcast_np_dtypes = {
    np.dtype("int64"): np.dtype("int32"),
    np.dtype("uint64"): np.dtype("uint32"),
    np.dtype("float64"): np.dtype("float32"),
}


def to_numpy(
    x,
    dtype=None,
    downcast: bool = True,
    copy: bool = True,
    log2_scale: Optional[int] = None,
    nan_on_overflow: Optional[bool] = None,
) -> np.ndarray:
    """Host data (numpy, torch, lists, scalars) as a C-ordered numpy array, as `popxl.utils`.

    64-bit types narrow to 32 bits when ``dtype`` is None and ``downcast``; float8 dtypes convert
    float data with ``log2_scale`` / ``nan_on_overflow``; ``copy=False`` returns ``x``'s memory
    where no conversion is needed (an np.memmap is never copied).

    >>> to_numpy([0.0, 1.0]).dtype, to_numpy([1, 2], downcast=False).dtype
    (dtype('float32'), dtype('int64'))
    """
    if isinstance(x, np.memmap):
        _check_memmap(x, dtype)
    if isinstance(x, torch.Tensor):
        x = torch_to_host(x.detach().cpu())
    if dtype is not None and dtype.name.startswith("float8"):
        return _to_fp8(x, dtype, copy, log2_scale, nan_on_overflow)
    if log2_scale is not None or nan_on_overflow is not None:
        raise ValueError(
            "to_numpy: log2_scale and nan_on_overflow apply to popxl.float8_143 / float8_152 only."
        )
    if isinstance(x, np.memmap):
        return x
    arr = np.asarray(x, dtype=None if dtype is None else dtype.as_numpy(), order="C")
    if dtype is None and downcast and arr.dtype in downcast_np_dtypes:
        return np.array(arr, dtype=downcast_np_dtypes[arr.dtype], order="C")
    return arr.copy() if copy else arr


def _to_fp8(x, dtype, copy, log2_scale, nan_on_overflow) -> np.ndarray:
    arr = x if isinstance(x, np.memmap) else np.asarray(x, order="C")
    if arr.dtype == dtype.as_numpy():
        return arr.copy() if copy else arr
    if arr.dtype.kind != "f":
        raise TypeError(
            f"to_numpy: {arr.dtype} data cannot become {dtype.name}; pass float16, float32 or "
            "float64 values (converted with log2_scale) or a popxl float8 array."
        )
    scale = 0 if log2_scale is None else log2_scale
    nanoo = True if nan_on_overflow is None else nan_on_overflow
    return host_pow2scale_cast_to_fp8(arr, dtype, scale, nanoo)


def _check_memmap(x: np.memmap, dtype) -> None:
    """A memmap is used without a copy: PopXL refuses what would need one."""
    if dtype is not None and np.dtype(dtype.as_numpy()) != x.dtype:
        raise ValueError(
            f"to_numpy: an np.memmap of {x.dtype} cannot become {dtype.name} without a copy; "
            "pass dtype=None or the memmap's own dtype."
        )
    if not (x.flags.c_contiguous and x.flags.aligned):
        raise ValueError("to_numpy: an np.memmap must be C-ordered and aligned (no copy is made).")
    if x.dtype in downcast_np_dtypes:
        raise ValueError(
            f"to_numpy: an np.memmap of {x.dtype} would need downcasting into a new array; "
            "store the memmap as a 32-bit type."
        )


def table_to_string(rows: Sequence[Sequence[object]], sep: str = " | ") -> str:
    """Rows as an aligned text table (the first row is the header)."""
    cells: List[List[str]] = [[str(c) for c in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(max(map(len, cells)))]
    lines = [sep.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
