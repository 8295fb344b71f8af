"""Host conversions to and from PopXL's float8 formats (``popxl.fp8_utils``).

The formats (Graphcore's, arXiv:2206.02915): ``float8_143`` has 1 sign, 4 exponent and 3
mantissa bits with exponent bias 8; ``float8_152`` 1-5-2 with bias 16. Neither has infinities
or a negative zero: the bit pattern 0x80 is the one NaN. Largest values: 240 and 57344. These
are exactly torch's ``float8_e4m3fnuz`` / ``float8_e5m2fnuz`` (not ``float8_e4m3fn`` /
``float8_e5m2``, which have bias 7 / 15 and other NaN and infinity codes);
``tests/test_fp8.py`` checks all 256 codes of each against the bit formula.

Conversions round to nearest, ties to even. A value beyond the format's range becomes NaN
(``nan_on_overflow=True``, as the IPU does by default) or the largest value of its sign
(``False``); inf is beyond the range. ``log2_scale`` must be in [-32, 32).
"""

from __future__ import annotations

import numpy as np
import torch

from . import dtypes

__all__ = [
    "host_pow2scale_cast_to_fp8",
    "host_pow2scale_cast_from_fp8",
    "host_fp8_mse_scale",
    "fp8_max",
    "torch_fp8_dtype",
]

_TORCH = {"float8_143": torch.float8_e4m3fnuz, "float8_152": torch.float8_e5m2fnuz}
_MAX = {"float8_143": 240.0, "float8_152": 57344.0}
LOG2_SCALE_RANGE = (-32, 32)  # [low, high)


def _checked_format(dtype, where: str) -> str:
    if dtype not in (dtypes.float8_143, dtypes.float8_152):
        raise TypeError(
            f"{where}: dtype must be popxl.float8_143 or popxl.float8_152, got {dtype!r}."
        )
    return dtype.name


def torch_fp8_dtype(dtype) -> torch.dtype:
    """The torch dtype with the same bits as a popxl float8 dtype."""
    return _TORCH[_checked_format(dtype, "torch_fp8_dtype")]


def fp8_max(dtype) -> float:
    """The largest finite value of a popxl float8 dtype (240 or 57344)."""
    return _MAX[_checked_format(dtype, "fp8_max")]


def check_log2_scale(log2_scale, where: str) -> int:
    """``log2_scale`` as an int in [-32, 32), else ValueError."""
    s = int(log2_scale)
    low, high = LOG2_SCALE_RANGE
    if s != log2_scale or not low <= s < high:
        raise ValueError(
            f"{where}: log2_scale must be an integer in [{low}, {high}), got {log2_scale}."
        )
    return s


def scaled_to_fp8(x: torch.Tensor, log2_scale: int, dtype, nan_on_overflow: bool) -> torch.Tensor:
    """``cast(x * 2**log2_scale)`` to float8 (a torch float8 tensor); x is read as float32."""
    y = x.to(torch.float32) * (2.0**log2_scale)
    if not nan_on_overflow:
        m = fp8_max(dtype)
        y = y.clamp(-m, m)  # NaN stays NaN
    return y.to(torch_fp8_dtype(dtype))


def host_pow2scale_cast_to_fp8(
    src, dtype=dtypes.float8_143, log2_scale: int = 0, nan_on_overflow: bool = True
) -> np.ndarray:
    """``cast(src * 2**log2_scale)`` to float8 on the host: the bits as a uint8 array.

    >>> host_pow2scale_cast_to_fp8(np.array([1.0, -2.0, 300.0]), log2_scale=0).tolist()
    [64, 200, 128]
    """
    _checked_format(dtype, "host_pow2scale_cast_to_fp8")
    s = check_log2_scale(log2_scale, "host_pow2scale_cast_to_fp8")
    x = torch.from_numpy(np.array(src, dtype=np.float32))
    return scaled_to_fp8(x, s, dtype, nan_on_overflow).view(torch.uint8).numpy()


def fp8_bits(src, where: str) -> np.ndarray:
    """Float8 host data as its uint8 bits: a uint8 array or a popxl float8 structured array."""
    arr = np.asarray(src)
    if arr.dtype in (dtypes.np_dtype_float8_143, dtypes.np_dtype_float8_152, np.dtype(np.uint8)):
        return np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape)
    raise TypeError(
        f"{where}: float8 data must be uint8 bits (or a popxl float8 array), got {arr.dtype}."
    )


def host_pow2scale_cast_from_fp8(src, dtype=dtypes.float8_143, log2_scale: int = 0) -> np.ndarray:
    """``cast(src) * 2**log2_scale`` on the host: float8 bits (uint8) of format ``dtype`` to
    float32 (which holds every float8 value, scaled, exactly).

    >>> host_pow2scale_cast_from_fp8(np.array([64, 200, 128], np.uint8), log2_scale=1).tolist()
    [2.0, -4.0, nan]
    """
    _checked_format(dtype, "host_pow2scale_cast_from_fp8")
    s = check_log2_scale(log2_scale, "host_pow2scale_cast_from_fp8")
    bits = torch.from_numpy(fp8_bits(src, "host_pow2scale_cast_from_fp8").copy())
    return (bits.view(torch_fp8_dtype(dtype)).to(torch.float32) * (2.0**s)).numpy()


def host_fp8_mse_scale(pb_data, dtype=dtypes.float8_143) -> int:
    """The log2 scale in [-31, 32) whose float8 round trip (saturating) of ``pb_data`` has the
    smallest mean squared error (the smallest such scale on a tie).

    Scaling by a power of two changes a float8 rounding error only where values saturate or
    fall into the subnormal range, so many scales can tie.
    """
    _checked_format(dtype, "host_fp8_mse_scale")
    x = torch.from_numpy(np.array(pb_data, dtype=np.float32)).to(torch.float64)
    best, best_err = None, None
    for s in range(LOG2_SCALE_RANGE[0] + 1, LOG2_SCALE_RANGE[1]):  # -s must be valid too
        back = scaled_to_fp8(x, s, dtype, False).to(torch.float64) * (2.0**-s)
        err = float(torch.mean((back - x) ** 2))
        if best_err is None or err < best_err:
            best, best_err = s, err
    return best
