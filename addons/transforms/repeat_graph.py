"""`repeat_graph`: run a whole graph (the main graph too) ``repeat_count`` times, in place."""

from __future__ import annotations

import popxl_core
from popxl_core import ops
from popxl_core.graph_edit import move_ops_into_subgraph

__all__ = ["repeat_graph"]


def repeat_graph(graph: popxl_core.Graph, repeat_count: int) -> popxl_core.Graph:
    """Move the ops of ``graph`` into a new subgraph and make ``graph`` a loop that calls it
    ``repeat_count`` times. Returns the new subgraph (the loop body).

    Tensors the ops read from ``graph`` (variables, constants, inputs) become body inputs, by
    reference where the ops write them, so in-place updates carry over from one iteration to
    the next; host loads and stores happen once per iteration (set ``ir.num_host_transfers``
    to match). Op ids, op order and topological constraints are kept.

    >>> import numpy as np
    >>> ir = popxl_core.Ir()
    >>> with ir.main_graph:
    ...     v = popxl_core.variable(np.zeros(2, np.float32), name="v")
    ...     _ = ops.var_updates.accumulate_(v, popxl_core.constant(np.ones(2, np.float32)))
    >>> body = repeat_graph(ir.main_graph, 3)
    >>> [op.type for op in ir.main_graph.ops], [op.type for op in body.ops]
    (['Loop'], ['Accumulate'])
    >>> with popxl_core.Session(ir, "ipu_model") as s:
    ...     _ = s.run()
    >>> s.get_tensor_data(v).tolist()
    [3.0, 3.0]
    """
    if not isinstance(repeat_count, int) or repeat_count < 1:
        raise ValueError(
            f"repeat_graph: repeat_count must be a positive int, got {repeat_count!r}."
        )
    body, inputs = move_ops_into_subgraph(graph, f"{graph.name or 'main'}_repeated")
    with graph:
        ops.repeat(body, repeat_count, inputs_dict=inputs)
    return body
