"""`WeightsDict`: host data for variables, checked against each variable's shape and dtype."""

from __future__ import annotations

from typing import Any

import numpy as np

from popxl_core import Tensor, dtype
from popxl_core.tensor import to_numpy

from ..utils import OrderedDict

__all__ = ["WeightsDict", "host_value"]


def _host_shape(var: Tensor) -> tuple[int, ...]:
    return tuple(getattr(var, "shape_on_host", var.shape))


class WeightsDict(OrderedDict):
    """A ``{Variable: np.ndarray}`` dict that rejects data of the wrong shape or dtype.

    Pass it to ``session.write_variables_data``.
    """

    def __init__(self, items: Any = (), **kwargs: Any) -> None:
        super().__init__()
        for k, v in dict(items, **kwargs).items():
            self[k] = v

    def __setitem__(self, var: Tensor, value: np.ndarray) -> None:
        value = np.asarray(value)
        if value.shape != _host_shape(var):
            raise ValueError(
                f"WeightsDict: data of shape {value.shape} for {var.id!r}, which "
                f"has host shape {_host_shape(var)}."
            )
        if value.dtype != var.dtype.as_numpy():
            raise TypeError(
                f"WeightsDict: data of dtype {value.dtype} for {var.id!r}, which "
                f"is {var.dtype.name}."
            )
        super().__setitem__(var, value)


def host_value(var: Tensor, data: Any, dt: dtype | None = None) -> np.ndarray:
    """``data`` (numpy or torch) as host data for ``var``: cast to ``dt`` (default the
    variable's dtype) and repeated over the replica groups of a grouped variable."""
    arr = to_numpy(data, dt or var.dtype)
    host = _host_shape(var)
    if arr.shape != host and host[1:] == arr.shape:
        arr = np.ascontiguousarray(np.broadcast_to(arr, host))
    return arr
