"""PopXL's histogram estimate of a float8 scaling bias (``popxl.fp8_utils.host_fp8_mse_scale``).

The estimate is PopXL's documented algorithm, reproduced in its arithmetic, including the
order of its float64 sums (two biases tie only when their sums are equal to the last bit, and a
tie picks the middle bias) and two features of its error model that users see in the scale it
returns: the flushed range always counts half the smallest source value squared once, and the
saturated range measures the distance from the top of the format placed by the bias index
rather than by the source exponent it starts at.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

__all__ = ["mse_scale", "FORMATS"]

# name -> (exponent bits, mantissa bits, exponent bias); both float8 formats have subnormals
# and no exponent code reserved for NaN (arXiv:2206.02915)
FORMATS = {"float8_143": (4, 3, 8), "float8_152": (5, 2, 16)}
BIAS_RANGE = (-31, 31)  # the scaling biases tried, both ends included
_SRC_LOW, _SRC_HIGH = -126, 126  # float32's normal exponents (the source is read as float32)
_SRC_MANTISSA = {np.dtype(np.float32): 23, np.dtype(np.float16): 10}


def _format_range(name: str) -> Tuple[int, int]:
    """Lowest (subnormal) and highest binary exponent of a float8 format."""
    ebits, mbits, bias = FORMATS[name]
    return 1 - bias - mbits, (1 << ebits) - 1 - bias


def _limits() -> list:
    # python's 2 ** i: ints from 2 ** 0 up, as the reference's sums use them
    return [2**i for i in range(_SRC_LOW, _SRC_HIGH)]


def _histogram(src: np.ndarray, n_limits: int) -> np.ndarray:
    """Normalised counts: [below 2**-126, one bin per binary exponent, above 2**125]."""
    mag = np.abs(src.astype(np.float64))
    counts = np.zeros(n_limits + 1)
    low, high = 2.0**_SRC_LOW, 2.0 ** (_SRC_HIGH - 1)
    exps = np.frexp(mag)[1]  # NaN has exponent 0 and lands in that bin, as in the reference
    bins = np.where(mag < low, 0, np.where(mag > high, n_limits, exps - _SRC_LOW))
    np.add.at(counts, bins, 1.0)
    return counts / counts.sum()


def _mse(hist, limits, first: int, index: int, span: int, q: float) -> float:
    """The error model for one scaling bias: flushed, quantised, saturated, summed in order."""
    n = len(limits)
    mse = 0
    for i in range(first):
        if i == 0:
            mse += (limits[0] / 2) ** 2
        mse += limits[i] ** 2 * hist[i + 1]
    for i in range(first, min(first + span, n)):
        mse += limits[i] ** 2 * hist[i + 1] * q
    for i in range(first + span, n):
        mse += (limits[index + span - 1] - limits[i]) ** 2 * hist[i + 1]
    return mse


def mse_scale(src: np.ndarray, fmt: str) -> Tuple[float, int]:
    """``(lowest error, scaling bias)`` for ``src`` (float16 or float32, flat) cast to ``fmt``;
    PopXL returns the bias negated as the log2 scale."""
    limits = _limits()
    hist = _histogram(src, len(limits))
    low, high = _format_range(fmt)
    span = high - low + 1
    q = 2 ** (-2.0 * (_SRC_MANTISSA[np.dtype(src.dtype)] - FORMATS[fmt][1]))
    first_src = max(0, low + BIAS_RANGE[0] - _SRC_LOW)
    last_src = min(low + BIAS_RANGE[1] - _SRC_LOW, _SRC_HIGH - _SRC_LOW)
    by_error: Dict[float, List[int]] = {}
    for index in range(last_src - first_src + 1):
        err = _mse(hist, limits, first_src + index, index, span, q)
        by_error.setdefault(err, []).append(index + BIAS_RANGE[0])
    best = min(by_error)
    ties = sorted(by_error[best])
    return best, ties[len(ties) // 2]
