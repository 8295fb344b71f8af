"""`popxl.testing`: dtype lists for parametrised tests."""

from __future__ import annotations

from typing import List

from . import dtypes

__all__ = ["get_all_dtypes", "get_all_int_dtypes"]


def get_all_dtypes(include_float8: bool = False) -> List[dtypes.dtype]:
    """Every popxl dtype, without the float8 types unless ``include_float8``.

    >>> [d.name for d in get_all_dtypes()][:3]
    ['bool', 'int8', 'int16']
    """
    return [d for d in _ALL if include_float8 or not d.name.startswith("float8")]


def get_all_int_dtypes(
    include_signed: bool = True, include_unsigned: bool = True, include_8bit_ints: bool = True
) -> List[dtypes.dtype]:
    """The integer dtypes, signed then unsigned (PopXL's arguments); ``include_8bit_ints=False``
    leaves out int8 and uint8."""
    return [
        d
        for d in _ALL
        if d.is_int
        and (include_signed if d.is_signed else include_unsigned)
        and (include_8bit_ints or d.itemsize > 1)
    ]


_ALL = [
    dtypes.bool,
    dtypes.int8,
    dtypes.int16,
    dtypes.int32,
    dtypes.int64,
    dtypes.uint8,
    dtypes.uint16,
    dtypes.uint32,
    dtypes.uint64,
    dtypes.float8_143,
    dtypes.float8_152,
    dtypes.float16,
    dtypes.float32,
    dtypes.float64,
    dtypes.complex64,
    dtypes.complex128,
]
