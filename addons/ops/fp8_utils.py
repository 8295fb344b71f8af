"""The floating point formats popxl.addons' float8 scale estimates name (``ops.fp8_utils``):
exponent and mantissa widths, bias, and range of float32, float16 and the two float8 formats
(arXiv:2206.02915: float8 has subnormals and no exponent code kept for NaN)."""

from __future__ import annotations

from collections import namedtuple

__all__ = [
    "FpDef",
    "ieee_fp32_no_denorms",
    "ieee_fp16_denorms",
    "float8_152_def",
    "float8_143_def",
]

FpDef = namedtuple(
    "FpDef",
    [
        "num_exp_bits",
        "num_mantissa_bits",
        "fix_exponent_bias",
        "include_denorm",  # subnormal values counted
        "has_nans",  # a whole exponent code means NaN
        "max_value",
        "max_exp",
        "min_exp",  # the lowest normal exponent (float8: the lowest subnormal's)
    ],
)

ieee_fp32_no_denorms = FpDef(8, 23, 127, False, True, 3.4028235e38, 127, -126)
ieee_fp16_denorms = FpDef(5, 10, 15, True, True, 65504, 15, -14)
float8_152_def = FpDef(5, 2, 16, True, False, 57344, 15, -17)
float8_143_def = FpDef(4, 3, 8, True, False, 240, 7, -10)
