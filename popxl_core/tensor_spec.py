"""`TensorSpec` (shape, dtype, meta shape) and the `TensorByRef` annotation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Iterator

from .arg_checks import checked_dtype, checked_shape
from .dtypes import dtype

__all__ = ["TensorSpec", "TensorByRef"]


class TensorSpec(Mapping):
    """Shape, dtype and (replica-sharded) meta shape of a tensor; accepted by `create_graph`."""

    # ``nbytes`` is computed once: specs are never changed after construction, and the
    # simulator's planner asks a tensor's byte count ~600 times per Session build
    __slots__ = ("shape", "dtype", "meta_shape", "nbytes")

    def __init__(self, shape, dtype: dtype, meta_shape=()) -> None:
        self.shape = checked_shape(shape, "TensorSpec")
        self.dtype = checked_dtype(dtype, "TensorSpec")
        self.meta_shape = checked_shape(meta_shape or (), "TensorSpec meta_shape")
        self.nbytes: int = math.prod(self.shape) * self.dtype.itemsize

    def __getitem__(self, key):
        if key not in ("shape", "dtype", "meta_shape"):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(("shape", "dtype", "meta_shape"))

    def __len__(self) -> int:
        return 3

    def to_dict(self) -> dict:
        return {"shape": self.shape, "dtype": self.dtype, "meta_shape": self.meta_shape}

    def to_tuple(self) -> tuple:
        return (self.shape, self.dtype, self.meta_shape)

    def __hash__(self) -> int:
        return hash(self.to_tuple())

    def __eq__(self, other) -> bool:
        return isinstance(other, TensorSpec) and self.to_tuple() == other.to_tuple()

    @property
    def nelms(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype!r}, meta_shape={self.meta_shape})"


class _ByRef:
    """The `TensorByRef` annotation: compared by identity in `create_graph`."""

    __name__ = "TensorByRef"
    __supertype__ = None

    def __repr__(self) -> str:
        return "popxl.TensorByRef"


TensorByRef = _ByRef()
