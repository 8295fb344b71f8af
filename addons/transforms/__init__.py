"""addons transforms: functions from graphs to graphs."""

from .autodiff import autodiff, autodiff_with_accumulation
from .available_memory_proportion import (
    set_available_memory_proportion_by_ipu,
    set_graph_available_memory_proportion_by_ipu,
)
from .batch_serialisation import (
    BatchSerialResult,
    RemoteHandle,
    batch_serial_buffer,
    batch_serialise,
    batch_serialise_fwd_and_grad,
)
from .fc_pass import disable_fc_pass, enable_fc_pass
from .pipelining import pipelined_execution
from .recompute import recompute_graph

# repeat_graph is imported by its module path (popxl_addons.transforms.repeat_graph), as in
# popxl.addons, which does not re-export it here.

__all__ = [
    "autodiff",
    "autodiff_with_accumulation",
    "recompute_graph",
    "BatchSerialResult",
    "RemoteHandle",
    "batch_serial_buffer",
    "batch_serialise",
    "batch_serialise_fwd_and_grad",
    "set_available_memory_proportion_by_ipu",
    "set_graph_available_memory_proportion_by_ipu",
    "enable_fc_pass",
    "disable_fc_pass",
    "pipelined_execution",
]
