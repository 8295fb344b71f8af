"""Host IO helpers: make a stream and load from it, or store to a new stream, in one call."""

from __future__ import annotations

import numpy as np

import popxl_core
from popxl_core import DeviceToHostStream, HostToDeviceStream, Tensor, ops
from popxl_core.tensor import HostTensor, to_numpy

__all__ = ["host_load", "host_store"]


def host_load(
    t: HostTensor, dtype: popxl_core.dtype | None = None, name: str | None = None
) -> tuple[np.ndarray, HostToDeviceStream, Tensor]:
    """A stream shaped like the host data ``t`` and a load from it in the current graph.

    Returns:
        ``(data, stream, tensor)``: ``t`` as a numpy array (64-bit types downcast, or cast to
        ``dtype``), the new stream (named ``"<name>_stream"``) and the loaded tensor.

    >>> import numpy as np, popxl_core as popxl
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     data, stream, x = host_load(np.zeros((2, 3)), name="x")
    >>> data.dtype, stream.shape, x.shape
    (dtype('float32'), (2, 3), (2, 3))
    """
    data = to_numpy(t, dtype)
    dt = dtype if dtype is not None else popxl_core.dtype.as_dtype(data)
    stream = popxl_core.h2d_stream(data.shape, dt, name=f"{name}_stream" if name else None)
    return data, stream, ops.host_load(stream, name)


def host_store(t: Tensor) -> DeviceToHostStream:
    """Store ``t`` to a new device-to-host stream named ``f"{t.name}_stream"``; return it."""
    stream = popxl_core.d2h_stream(t.shape, t.dtype, name=f"{t.name}_stream")
    ops.host_store(stream, t)
    return stream
