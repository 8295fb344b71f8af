"""addons: popxl.addons re-implemented on popxl_core (Modules, named tensors, factories,
graphs with named args, graph caching and gradient transforms)."""

from popxl_core.transforms import GradGraphInfo

from . import array_munging, layers, ops, optimizers, remote, rts, testing_utils, transforms
from .array_munging import (
    handle_negative_axis,
    pad_axis,
    repeat,
    repeat_axis,
    repeat_shard,
    shard,
    shard2D,
    split2D,
    squeeze_safe,
    tensor_parallel_input,
    unshard,
    unshard2D,
    unshard_arrays,
)
from .debugging import print_tensor, print_text
from .dot_tree import DotTree, to_mapping
from .graph import BoundGraph, GraphWithNamedArgs
from .graph_cache import GraphCache, function
from .graph_utils import is_subgraph, route_tensor_into_graph, seed_variable
from .module import Module, NameScopeMeta, create_grad_graph_info
from .named_tensors import NamedTensorData, NamedTensors, print_named_tensors
from .ops import cross_entropy, cross_entropy_with_grad, fp8_amax_scale, host_load, host_store
from .performance_utils import (
    evaluate_FLOPs,
    evaluate_ir_FLOPs,
    format_flops_scientific,
    print_FLOPs,
    total_FLOPs,
)
from .remote import (
    NamedRemoteBuffers,
    create_remote_buffer,
    load_remote_graph,
    named_buffers,
    named_variable_buffers,
    store_remote_graph,
)
from .streams import InputStreams, OutputStreams
from .task_session import TaskSession, write_variables_pb
from .transforms import (
    BatchSerialResult,
    RemoteHandle,
    autodiff,
    autodiff_with_accumulation,
    batch_serial_buffer,
    batch_serialise,
    batch_serialise_fwd_and_grad,
    disable_fc_pass,
    enable_fc_pass,
    pipelined_execution,
    recompute_graph,
    set_available_memory_proportion_by_ipu,
    set_graph_available_memory_proportion_by_ipu,
)
from .utils import OrderedDict, WeightsDict, git_commit, timer
from .variable_factory import (
    NamedVariableFactories,
    VariableFactory,
    add_replica_sharded_variable_input,
    add_variable_input,
)

__all__ = [
    "BoundGraph",
    "DotTree",
    "GraphCache",
    "GraphWithNamedArgs",
    "InputStreams",
    "OutputStreams",
    "is_subgraph",
    "route_tensor_into_graph",
    "seed_variable",
    "Module",
    "NameScopeMeta",
    "NamedTensorData",
    "NamedTensors",
    "NamedVariableFactories",
    "OrderedDict",
    "VariableFactory",
    "add_replica_sharded_variable_input",
    "add_variable_input",
    "autodiff",
    "BatchSerialResult",
    "RemoteHandle",
    "batch_serial_buffer",
    "batch_serialise",
    "batch_serialise_fwd_and_grad",
    "autodiff_with_accumulation",
    "create_grad_graph_info",
    "function",
    "print_named_tensors",
    "recompute_graph",
    "to_mapping",
    "transforms",
    "WeightsDict",
    "cross_entropy",
    "cross_entropy_with_grad",
    "host_load",
    "host_store",
    "fp8_amax_scale",
    "layers",
    "array_munging",
    "remote",
    "rts",
    "testing_utils",
    "NamedRemoteBuffers",
    "create_remote_buffer",
    "load_remote_graph",
    "named_buffers",
    "named_variable_buffers",
    "store_remote_graph",
    "ops",
    "optimizers",
    "print_tensor",
    "print_text",
    "TaskSession",
    "write_variables_pb",
    "evaluate_FLOPs",
    "evaluate_ir_FLOPs",
    "format_flops_scientific",
    "print_FLOPs",
    "total_FLOPs",
    "disable_fc_pass",
    "enable_fc_pass",
    "pipelined_execution",
    "set_available_memory_proportion_by_ipu",
    "set_graph_available_memory_proportion_by_ipu",
    "GradGraphInfo",
    "timer",
    "GIT_COMMIT",
    # array_munging, star-exported by popxl.addons
    "handle_negative_axis",
    "pad_axis",
    "repeat",
    "repeat_axis",
    "repeat_shard",
    "shard",
    "shard2D",
    "split2D",
    "squeeze_safe",
    "tensor_parallel_input",
    "unshard",
    "unshard2D",
    "unshard_arrays",
]


def __getattr__(name: str):
    # popxl.addons sets GIT_COMMIT at import (through gitpython); here it is looked up when
    # first read, so importing addons runs no subprocess
    if name == "GIT_COMMIT":
        return git_commit()
    raise AttributeError(f"module 'addons' has no attribute {name!r}")
