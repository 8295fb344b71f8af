"""Host <-> device streams. Their tensors always live in the main graph."""

from __future__ import annotations

from typing import Optional

from .arg_checks import checked_dtype, checked_shape
from .context import gcg
from .dtypes import dtype
from .tensor import Tensor, TensorSpec

__all__ = ["HostToDeviceStream", "DeviceToHostStream", "h2d_stream", "d2h_stream"]


class _Stream:
    def __init__(self, tensor: Tensor) -> None:
        self._stream_tensor = tensor

    @property
    def dtype(self) -> dtype:
        return self._stream_tensor.dtype

    @property
    def shape(self):
        return self._stream_tensor.shape

    @property
    def spec(self) -> TensorSpec:
        return self._stream_tensor.spec

    @property
    def tensor_id(self) -> str:
        return self._stream_tensor.id

    def __eq__(self, other) -> bool:
        return isinstance(other, _Stream) and other._stream_tensor is self._stream_tensor

    def __hash__(self) -> int:
        # the tensor's hash (its id) without the second Python call: streams key the
        # run's dicts, hashed ~8 times per stream per step
        return id(self._stream_tensor)

    def __str__(self) -> str:
        return f"{type(self).__name__} {self._stream_tensor}"

    __repr__ = __str__


class HostToDeviceStream(_Stream):
    """Carries one tensor per host transfer from the host to the IPU."""


class DeviceToHostStream(_Stream):
    """Carries one tensor per host transfer from the IPU to the host."""


def _stream_tensor(shape, dt: dtype, name: str, kind: str) -> Tensor:
    where = f"{kind}({name!r})"
    spec = TensorSpec(checked_shape(shape, where), checked_dtype(dt, where))
    main = gcg().main_graph
    return Tensor._create(main, main._create_tensor_id(name), spec)


def h2d_stream(shape, dtype: dtype, name: Optional[str] = None) -> HostToDeviceStream:
    """A host-to-device stream; load from it with `ops.host_load`."""
    return HostToDeviceStream(_stream_tensor(shape, dtype, name or "h2d_stream", "h2d_stream"))


def d2h_stream(shape, dtype: dtype, name: Optional[str] = None) -> DeviceToHostStream:
    """A device-to-host stream; write to it with `ops.host_store`."""
    return DeviceToHostStream(_stream_tensor(shape, dtype, name or "d2h_stream", "d2h_stream"))
