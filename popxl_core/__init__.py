"""popxl_core: PopXL re-implemented on a tensor-level IPU simulator built on torch CPU ops."""

from . import ops, transforms
from .context import (
    gcg,
    get_current_graph,
    get_ir,
    get_main_graph,
    gir,
    gmg,
    in_sequence,
    io_tiles,
    ipu,
    name_scope,
)
from .dtypes import (
    bool,
    complex64,
    complex128,
    double,
    dtype,
    float,
    float8_143,
    float8_152,
    float16,
    float32,
    float64,
    half,
    int8,
    int16,
    int32,
    int64,
    uint8,
    uint16,
    uint32,
    uint64,
)
from .graph import Graph
from .ir import Ir
from .module import Module
from .random_seed import create_seeds
from .remote_buffer import RemoteBuffer, remote_buffer, replica_sharded_buffer
from .remote_variables import (
    remote_replica_sharded_variable,
    remote_variable,
    replica_sharded_variable,
)
from .replica_grouping import ReplicaGrouping
from .sim.session import Session
from .streams import DeviceToHostStream, HostToDeviceStream, d2h_stream, h2d_stream
from .tensor import (
    Constant,
    Tensor,
    TensorByRef,
    TensorSpec,
    Variable,
    constant,
    graph_input,
    graph_output,
    variable,
)
from .tensorlocation import (
    ExecutionContext,
    ReplicatedTensorSharding,
    TensorLocation,
    TensorStorage,
    TileSet,
)

__all__ = [
    "ops", "transforms",
    "gcg", "get_current_graph", "get_ir", "get_main_graph", "gir", "gmg", "in_sequence",
    "io_tiles", "ipu", "name_scope",
    "dtype", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "half", "float8_143", "float8_152", "float16", "float", "float32", "double", "float64",
    "complex64", "complex128",
    "Graph", "Ir", "Module", "create_seeds", "ReplicaGrouping", "Session",
    "HostToDeviceStream", "DeviceToHostStream", "h2d_stream", "d2h_stream",
    "Tensor", "Variable", "Constant", "TensorSpec", "TensorByRef",
    "variable", "constant", "graph_input", "graph_output",
    "RemoteBuffer", "remote_buffer", "remote_variable", "remote_replica_sharded_variable",
    "replica_sharded_variable", "replica_sharded_buffer",
    "TensorStorage", "TensorLocation", "ReplicatedTensorSharding", "TileSet", "ExecutionContext",
]
