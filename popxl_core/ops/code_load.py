"""RemoteCodeLoad: load a graph's code from streaming memory before it is called.

On the IPU this lets graphs whose code is not always resident be swapped in. The simulator
keeps every compiled graph resident, so the op orders nothing and moves no data; its transfer
time is not modelled (the planner counts each graph's code once, as resident code).
"""

from __future__ import annotations

from typing import Literal

from ..graph import Graph
from .registry import OpDef, create_op, no_cost, register

__all__ = ["remote_code_load"]

CodeDestination = Literal["executable", "compute_buffer", "io_buffer"]
_DESTINATIONS = ("executable", "compute_buffer", "io_buffer")

REMOTE_CODE_LOAD = register(
    OpDef(
        "RemoteCodeLoad",
        lambda ins, graph_id, destination: [],
        lambda graph_id, destination: None,
        cost=no_cost,
        side_effect=True,
        tested_by="tests/test_conformance_core.py::test_remote_code_load",
    )
)


def remote_code_load(graph: Graph, destination: CodeDestination) -> None:
    """Load ``graph``'s code to ``destination`` ('executable', 'compute_buffer' or
    'io_buffer'); a no-op in the simulator, where all code stays resident."""
    if not isinstance(graph, Graph):
        raise TypeError(
            f"remote_code_load: graph must be a popxl Graph, got {type(graph).__name__}."
        )
    if destination not in _DESTINATIONS:
        raise ValueError(
            f"remote_code_load: destination must be one of {_DESTINATIONS}, got {destination!r}."
        )
    # the graph is named, not called: it must not count as an extra execution of its ops
    create_op(REMOTE_CODE_LOAD, [], {"graph_id": graph.id, "destination": destination})
