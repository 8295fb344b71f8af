"""addons transforms: functions from graphs to graphs."""

from .autodiff import autodiff, autodiff_with_accumulation
from .batch_serialisation import (
    BatchSerialResult,
    RemoteHandle,
    batch_serial_buffer,
    batch_serialise,
    batch_serialise_fwd_and_grad,
)
from .recompute import recompute_graph

__all__ = [
    "autodiff",
    "autodiff_with_accumulation",
    "recompute_graph",
    "BatchSerialResult",
    "RemoteHandle",
    "batch_serial_buffer",
    "batch_serialise",
    "batch_serialise_fwd_and_grad",
]
