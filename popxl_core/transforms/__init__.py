"""popxl.transforms: functions from graph to graph."""

from .autodiff import ExpectedConnection, ExpectedConnectionType, GradGraphInfo, autodiff
from .decompose_sum import decompose_sum
from .grad_info import new_grad_graph_info
from .merge_exchange import io_tile_exchange, merge_exchange

__all__ = [
    "autodiff",
    "decompose_sum",
    "GradGraphInfo",
    "ExpectedConnection",
    "ExpectedConnectionType",
    "merge_exchange",
    "io_tile_exchange",
    "new_grad_graph_info",
]
