"""Host conversions to and from PopXL's float8 formats (``popxl.fp8_utils``).

The formats (Graphcore's, arXiv:2206.02915): ``float8_143`` has 1 sign, 4 exponent and 3
mantissa bits with exponent bias 8; ``float8_152`` 1-5-2 with bias 16. Neither has infinities
or a negative zero: the bit pattern 0x80 is the one NaN. Largest values: 240 and 57344. These
are exactly torch's ``float8_e4m3fnuz`` / ``float8_e5m2fnuz`` (not ``float8_e4m3fn`` /
``float8_e5m2``, which have bias 7 / 15 and other NaN and infinity codes);
``tests/test_fp8.py`` checks all 256 codes of each against the bit formula.

Host float8 data is what PopXL makes it: numpy arrays of the structured dtypes
``popxl.dtypes.np_dtype_float8_143`` / ``np_dtype_float8_152`` (one uint8 field holding the bits).

Conversions round once, to nearest, ties to even, from the exact value ``src * 2**log2_scale``
(float64 sources too: they pass through float32 rounded to odd, which keeps the one rounding
exact). A finite value beyond the format's range becomes NaN (``nan_on_overflow=True``, as the
IPU does by default) or the largest value of its sign (``False``); inf and NaN always become NaN
(PopXL's own tests: float16 70000, an inf, casts to NaN either way). ``log2_scale`` must be in
[-32, 32).
"""

from __future__ import annotations

import numpy as np
import torch

from . import dtypes
from ._fp8_mse import mse_scale

__all__ = [
    "host_pow2scale_cast_to_fp8",
    "host_pow2scale_cast_from_fp8",
    "host_fp8_mse_scale",
    "host_fp8_mse_scale_pb",
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
    """``cast(x * 2**log2_scale)`` to float8 (a torch float8 tensor), rounded once."""
    y = _scaled_float32(x.detach().cpu().to(torch.float64) * (2.0**log2_scale))
    y = torch.where(torch.isinf(y), torch.nan, y)  # inf is NaN in float8 whatever the mode
    if not nan_on_overflow:
        m = fp8_max(dtype)
        y = y.clamp(-m, m)  # NaN stays NaN
    return y.to(torch_fp8_dtype(dtype))


def _scaled_float32(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded to odd (truncate, then set the last bit when inexact).

    torch casts to float8 from float32; rounding float64 to nearest first could round twice
    (a value just above a float8 tie lands on it). Rounding to odd keeps float32's 24 bits as a
    sticky record, so the float8 rounding that follows is the one exact rounding. A finite value
    beyond float32's range truncates to its largest value, which float8 then saturates or NaNs.
    """
    y = x.to(torch.float32)
    back = y.to(torch.float64)
    inexact = (back != x) & torch.isfinite(x)
    toward_zero = inexact & (back.abs() > x.abs())
    y = torch.where(toward_zero, torch.nextafter(y, torch.zeros_like(y)), y)
    bits = y.view(torch.int32)
    return torch.where(inexact, bits | 1, bits).view(torch.float32)


def _float_source(src, where: str) -> np.ndarray:
    """``src`` as a float16/32/64 numpy array (torch tensors and python numbers accepted)."""
    if isinstance(src, torch.Tensor):
        src = src.detach().cpu().numpy()
    arr = np.asarray(src, order="C")
    if arr.dtype.kind in "iub" or arr.dtype.kind == "f":
        return arr.astype(np.float64) if arr.dtype.kind != "f" else arr
    raise TypeError(
        f"{where}: src must hold float16, float32 or float64 values, got {arr.dtype} "
        "(float8 data is already converted)."
    )


def host_pow2scale_cast_to_fp8(
    src, dtype=dtypes.float8_143, log2_scale: int = 0, nan_on_overflow: bool = True
) -> np.ndarray:
    """``cast(src * 2**log2_scale)`` to float8 on the host, as PopXL's float8 host array
    (structured dtype ``np_dtype_float8_143`` / ``np_dtype_float8_152``).

    >>> x = host_pow2scale_cast_to_fp8(np.array([1.0, -2.0, 300.0]), log2_scale=0)
    >>> x.dtype == dtypes.np_dtype_float8_143, x.view(np.uint8).tolist()
    (True, [64, 200, 128])
    """
    _checked_format(dtype, "host_pow2scale_cast_to_fp8")
    s = check_log2_scale(log2_scale, "host_pow2scale_cast_to_fp8")
    arr = _float_source(src, "host_pow2scale_cast_to_fp8")
    bits = scaled_to_fp8(torch.from_numpy(arr), s, dtype, nan_on_overflow).view(torch.uint8)
    return bits.numpy().view(dtype.as_numpy()).reshape(arr.shape)


def fp8_bits(src, where: str) -> np.ndarray:
    """The uint8 bits of a popxl float8 host array."""
    arr = np.asarray(src)
    if arr.dtype in (dtypes.np_dtype_float8_143, dtypes.np_dtype_float8_152):
        return np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape)
    raise TypeError(
        f"{where}: src must be a popxl float8 array (dtype popxl.dtypes.np_dtype_float8_143 or "
        f"np_dtype_float8_152, as host_pow2scale_cast_to_fp8 returns), got {arr.dtype}; view "
        "uint8 bits with bits.view(popxl.dtypes.np_dtype_float8_143)."
    )


_FROM_TARGETS = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def host_pow2scale_cast_from_fp8(src, dtype=dtypes.float32, log2_scale: int = 0) -> np.ndarray:
    """``cast(src, dtype) * 2**log2_scale`` on the host: a popxl float8 array to float16, float32
    or float64, rounded once from the exact scaled value.

    >>> bits = np.array([64, 200, 128], np.uint8).view(dtypes.np_dtype_float8_143)
    >>> host_pow2scale_cast_from_fp8(bits, dtypes.float32, log2_scale=1).tolist()
    [2.0, -4.0, nan]
    """
    if dtype is None or dtype.name not in _FROM_TARGETS:
        raise TypeError(
            "host_pow2scale_cast_from_fp8: dtype must be popxl.float16, float32 or float64, "
            f"got {dtype!r}."
        )
    s = check_log2_scale(log2_scale, "host_pow2scale_cast_from_fp8")
    arr = np.asarray(src)
    bits = torch.from_numpy(fp8_bits(arr, "host_pow2scale_cast_from_fp8").copy())
    fmt = dtypes.float8_143 if arr.dtype == dtypes.np_dtype_float8_143 else dtypes.float8_152
    exact = bits.view(torch_fp8_dtype(fmt)).to(torch.float64) * (2.0**s)
    return exact.numpy().astype(_FROM_TARGETS[dtype.name])


def host_fp8_mse_scale(src, dtype=dtypes.float8_143):
    """``(mse, log2_scale)``: PopXL's histogram estimate of the scale whose float8 cast of
    ``src`` (float16 or float32) loses the least, and that estimate's error.

    The data's binary exponents are histogrammed; for each scaling bias in [-31, 31] the error
    counts the exponents below the format's range (flushed), inside it (quantisation noise of
    the mantissa bits lost) and above it (saturated); the middle of the lowest-error biases wins,
    negated as PopXL returns it (multiply by ``2**log2_scale`` before the cast).
    """
    _checked_format(dtype, "host_fp8_mse_scale")
    arr = np.ascontiguousarray(_float_source(src, "host_fp8_mse_scale")).reshape(-1)
    if arr.dtype not in (np.float16, np.float32):
        raise TypeError(f"host_fp8_mse_scale: src must be float16 or float32, got {arr.dtype}.")
    metric, bias = mse_scale(arr, dtype.name)
    return metric, -bias


def host_fp8_mse_scale_pb(src, dtype=dtypes.float8_143) -> int:
    """The log2 scale for a float8 cast of ``src`` (float16 or float32) in [-31, 31].

    PopXL computes this in Poplar (``calculateMetadataForConversion``, closed source); PopXL's
    ``host_fp8_mse_scale`` documents itself as that algorithm in python, so this is its scale.
    """
    return host_fp8_mse_scale(src, dtype)[1]
