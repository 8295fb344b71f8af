"""PopXL dtypes: singletons with popxl's names, reprs and numpy/torch conversions."""

from __future__ import annotations

import builtins
from typing import Any, Dict, Optional

import numpy as np
import torch

__all__ = [
    "dtype",
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "half",
    "float16",
    "float",
    "float32",
    "double",
    "float64",
    "float8_143",
    "float8_152",
    "complex64",
    "complex128",
]

_BY_NAME: Dict[str, "dtype"] = {}


class dtype:
    """A PopXL data type. Instances are singletons; compare with ``is`` or ``==``."""

    __slots__ = ("_name", "_np", "_torch", "_is_int", "_is_float", "_is_signed", "_itemsize")
    # the slots' types, for the type checker (`_factory` fills them through object.__new__)
    _name: str
    _np: Any
    _torch: Optional[torch.dtype]
    _is_int: builtins.bool
    _is_float: builtins.bool
    _is_signed: builtins.bool
    _itemsize: int

    def __init__(self) -> None:
        raise TypeError("popxl.dtype cannot be constructed; use popxl.float32 and friends.")

    @classmethod
    def _factory(cls, name, np_type, torch_type, is_int, is_float, is_signed, itemsize) -> "dtype":
        self = object.__new__(cls)
        self._name = name
        self._np = np_type
        self._torch = torch_type
        self._is_int = is_int
        self._is_float = is_float
        self._is_signed = is_signed
        self._itemsize = itemsize
        _BY_NAME[name] = self
        return self

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_complex(self) -> builtins.bool:
        return self._name.startswith("complex")

    @property
    def is_int(self) -> builtins.bool:
        return self._is_int

    @property
    def is_floating_point(self) -> builtins.bool:
        return self._is_float

    @property
    def is_signed(self) -> builtins.bool:
        return self._is_signed

    @property
    def itemsize(self) -> int:
        """Bytes per element (used by the memory planner)."""
        return self._itemsize

    @classmethod
    def from_name(cls, name: str) -> "dtype":
        try:
            return _BY_NAME[name]
        except KeyError:
            raise ValueError(f"{name!r} is not a popxl dtype name.") from None

    @classmethod
    def as_dtype(cls, value: Any) -> "dtype":
        """Convert a numpy/torch dtype, python type, array or tensor to a popxl dtype."""
        return _as_dtype(value)

    def as_numpy(self) -> np.dtype:
        if self._np is None:
            raise TypeError(f"popxl.dtypes.{self._name} has no numpy equivalent.")
        return np.dtype(self._np)

    def as_torch(self) -> torch.dtype:
        if self._torch is None:
            raise TypeError(f"popxl.dtypes.{self._name} has no torch equivalent.")
        return self._torch

    def __repr__(self) -> str:
        # Users compare against popxl's text even when the module is aliased.
        return f"popxl.dtypes.{self._name}"

    def __reduce__(self):
        return (dtype.from_name, (self._name,))


_f8_143 = np.dtype([("float8_143", "u1")])
_f8_152 = np.dtype([("float8_152", "u1")])
np_dtype_float8_143 = _f8_143
np_dtype_float8_152 = _f8_152

bool = dtype._factory("bool", np.bool_, torch.bool, False, False, False, 1)
int8 = dtype._factory("int8", np.int8, torch.int8, True, False, True, 1)
int16 = dtype._factory("int16", np.int16, torch.int16, True, False, True, 2)
int32 = dtype._factory("int32", np.int32, torch.int32, True, False, True, 4)
int64 = dtype._factory("int64", np.int64, torch.int64, True, False, True, 8)
uint8 = dtype._factory("uint8", np.uint8, torch.uint8, True, False, False, 1)
uint16 = dtype._factory("uint16", np.uint16, torch.uint16, True, False, False, 2)
uint32 = dtype._factory("uint32", np.uint32, torch.uint32, True, False, False, 4)
uint64 = dtype._factory("uint64", np.uint64, torch.uint64, True, False, False, 8)
# float8: host data is a structured uint8 numpy dtype; on the simulated device the torch
# dtypes with the same bits (see popxl_core.fp8_utils for why these two)
float8_143 = dtype._factory("float8_143", _f8_143, torch.float8_e4m3fnuz, False, True, True, 1)
float8_152 = dtype._factory("float8_152", _f8_152, torch.float8_e5m2fnuz, False, True, True, 1)
float16 = dtype._factory("float16", np.float16, torch.float16, False, True, True, 2)
float32 = dtype._factory("float32", np.float32, torch.float32, False, True, True, 4)
float64 = dtype._factory("float64", np.float64, torch.float64, False, True, True, 8)
complex64 = dtype._factory("complex64", np.complex64, torch.complex64, False, False, True, 8)
complex128 = dtype._factory("complex128", np.complex128, torch.complex128, False, False, True, 16)
half = float16
float = float32  # popxl exports these names
double = float64

_NP_TO_POPXL = {d.as_numpy(): d for d in _BY_NAME.values() if d._np is not None}
# every torch dtype the simulator holds data in (float8 and the unsigned types included)
_TORCH_TO_POPXL = {d._torch: d for d in _BY_NAME.values() if d._torch is not None}
# PopXL's public table: only the torch dtypes that have a numpy twin (code iterating it calls
# tensor.numpy(), which torch's float8 and uint16/32/64 do not have)
_PT_TO_POPXL = {
    t: d
    for t, d in _TORCH_TO_POPXL.items()
    if not d.name.startswith(("float8", "uint16", "uint32", "uint64"))
}
# PopXL's python types: a python float is float32 there (its default float)
_PY_TO_POPXL = {builtins.bool: bool, builtins.int: int64, builtins.float: float32}


def _as_dtype(value: Any) -> dtype:
    if isinstance(value, dtype):
        return value
    if isinstance(value, torch.dtype):
        return _lookup(_TORCH_TO_POPXL, value)
    if isinstance(value, torch.Tensor):
        return _lookup(_TORCH_TO_POPXL, value.dtype)
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        return _lookup(_NP_TO_POPXL, value.dtype)
    if isinstance(value, type) and value in _PY_TO_POPXL:
        return _PY_TO_POPXL[value]
    try:
        return _lookup(_NP_TO_POPXL, np.dtype(value))
    except TypeError:
        raise ValueError(f"Cannot convert {value!r} to a popxl dtype.") from None


def _lookup(table, key) -> dtype:
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"{key!r} has no popxl dtype equivalent.") from None
