"""`fp8_amax_scale`: the power-of-two scale that puts a tensor's largest magnitude at the top of
a float8 format's range (popxl.addons ``ops.fp8_amax_scale``)."""

from __future__ import annotations

import popxl_core
from popxl_core import Tensor, ops
from popxl_core.fp8_utils import LOG2_SCALE_RANGE, fp8_max

__all__ = ["fp8_amax_scale"]


def fp8_amax_scale(src: Tensor, dtype=popxl_core.float8_143) -> Tensor:
    """``floor(log2(fp8_max / amax(src)))`` as an int32 scalar, clipped to [-32, 31]: the
    largest ``s`` with ``amax * 2**s <= fp8_max`` (so ``pow2scale_cast_to_fp8(src, s)`` does
    not overflow). An all-zero ``src`` gives 31.

    Built from popxl ops in the current graph (abs, reduce max, log2, floor, clip, cast); the
    log2 is of a float32 ratio, which is exact for power-of-two ratios.
    """
    if not src.dtype.is_floating_point or src.dtype.name.startswith("float8"):
        raise TypeError(f"fp8_amax_scale needs a float16 or float32 tensor, got {src.dtype.name}.")
    amax = ops.max(ops.abs(ops.cast(src, popxl_core.float32)))
    ratio = ops.div(popxl_core.constant(fp8_max(dtype), popxl_core.float32), amax)
    low, high = LOG2_SCALE_RANGE
    s = ops.clip(ops.floor(ops.log2(ratio)), low, high - 1)
    return ops.cast(s, popxl_core.int32)
